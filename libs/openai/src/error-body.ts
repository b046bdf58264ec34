/**
 * An error response body in OpenAI's shape:
 * `{"error":{"message":…,"type":…,"param":…,"code":…}}`. `param` names the request field at
 * fault, or is null.
 */
export function openaiErrorBody(
  message: string,
  type: string,
  code: string | null,
  param: string | null = null,
): string {
  return JSON.stringify({ error: { message, type, param, code } });
}
