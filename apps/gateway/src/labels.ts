// Metric labels take configured values only: a client's model string never becomes a label
// value, or any client could grow every series set (and /metrics) without bound.

/** The `model` label of requests whose model is not configured (or not read yet). */
export const UNKNOWN_MODEL = 'unknown';

/** The label for a request's model: itself when configured (routed), else `unknown`. */
export function modelLabel(model: string, routed: boolean): string {
  return routed ? model : UNKNOWN_MODEL;
}
