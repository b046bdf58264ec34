import { Buffer } from 'node:buffer';
import { expect } from 'vitest';
import type { PeekedRequest, RewritePlan } from '../src/index.js';

/** A plan with everything off; tests switch on what they need. */
export const basePlan: RewritePlan = {
  endpoint: 'chat',
  instruction: undefined,
  systemPrompt: 'prepend',
  completionPrefix: false,
  maxTokensFactor: 1,
  minMaxTokens: 16,
  defaultMaxTokens: 1000,
};

/** The limit a field gets, written out from the plan's rules (not from the code under test). */
export function expectedLimit(original: number | undefined, plan: RewritePlan): number {
  const base = original ?? plan.defaultMaxTokens;
  return Math.min(base, Math.max(plan.minMaxTokens, Math.round(base * plan.maxTokensFactor)));
}

const isObject = (v: unknown): v is Record<string, unknown> =>
  v !== null && typeof v === 'object' && !Array.isArray(v);

/** Where the edit goes in the original body: an exact offset, or anywhere in [from, to]. */
export interface ExpectedEdit {
  readonly from: number;
  readonly to: number;
  /** Bytes of the original replaced, from the chosen offset (0: an insert). */
  readonly removes: number;
  readonly bytes: Buffer;
}

/**
 * What a rewrite must give, worked out from JSON.parse and object edits alone: the parsed
 * result, and the splices (from the peek's spans) that must turn the body into the output.
 */
export function expectedRewrite(
  body: Buffer,
  peeked: PeekedRequest,
  plan: RewritePlan,
): { value: Record<string, unknown>; edits: ExpectedEdit[] } {
  const value = JSON.parse(body.toString('utf8')) as Record<string, unknown>;
  const edits: ExpectedEdit[] = [];
  const at = (offset: number, text: string, removes = 0): void => {
    edits.push({ from: offset, to: offset, removes, bytes: Buffer.from(text) });
  };
  const esc = (text: string) => JSON.stringify(text).slice(1, -1);
  const instruction = plan.instruction;
  if (instruction !== undefined && instruction !== '') {
    const messages = value.messages;
    if (plan.endpoint === 'chat' && Array.isArray(messages)) {
      const first: unknown = messages[0];
      if (
        plan.systemPrompt === 'append' &&
        isObject(first) &&
        first.role === 'system' &&
        typeof first.content === 'string'
      ) {
        first.content = `${first.content}\n\n${instruction}`;
        const span = peeked.messages!;
        edits.push({
          from: span.start + 1,
          to: span.end - 1,
          removes: 0,
          bytes: Buffer.from(esc(`\n\n${instruction}`)),
        });
      } else {
        messages.unshift({ role: 'system', content: instruction });
        const comma = messages.length > 1 ? ',' : '';
        at(
          peeked.messages!.start + 1,
          `{"role":"system","content":${JSON.stringify(instruction)}}${comma}`,
        );
      }
    }
    const prompt = value.prompt;
    if (plan.endpoint === 'completion' && plan.completionPrefix) {
      if (typeof prompt === 'string') {
        value.prompt = `${instruction}\n\n${prompt}`;
        at(peeked.prompt!.start + 1, esc(`${instruction}\n\n`));
      } else if (Array.isArray(prompt) && prompt.length === 1 && typeof prompt[0] === 'string') {
        prompt[0] = `${instruction}\n\n${prompt[0]}`;
        let q = peeked.prompt!.start + 1;
        while (body[q] !== 0x22) q++;
        at(q + 1, esc(`${instruction}\n\n`));
      }
    }
  }
  if (plan.maxTokensFactor !== 1) {
    const sent = (key: string) => typeof value[key] === 'number';
    if (sent('max_tokens') || sent('max_completion_tokens')) {
      for (const [key, span] of [
        ['max_tokens', peeked.maxTokensSpan],
        ['max_completion_tokens', peeked.maxCompletionTokensSpan],
      ] as const) {
        if (!sent(key)) continue;
        const original = value[key] as number;
        const limit = expectedLimit(original + 0, plan);
        if (limit === original) continue;
        value[key] = limit;
        at(span!.start, String(limit), span!.end - span!.start);
      }
    } else {
      const limit = expectedLimit(undefined, plan);
      const span = peeked.maxTokensSpan;
      if (span !== undefined) {
        at(span.start, String(limit), span.end - span.start);
      } else {
        let last = peeked.objectEnd - 1;
        while (' \t\r\n'.includes(String.fromCharCode(body[last]!))) last--;
        at(last + 1, `${last === peeked.objectStart ? '' : ','}"max_tokens":${limit}`);
      }
      value.max_tokens = limit;
    }
  }
  edits.sort((x, y) => x.from - y.from);
  return { value, edits };
}

/**
 * Checks that `out` is `body` with exactly `edits` spliced in: every segment between the edits
 * is byte-identical to the body's. An edit with a range of offsets must fit at one of them.
 */
export function expectSpliced(body: Buffer, out: Buffer, edits: readonly ExpectedEdit[]): void {
  let a = 0; // where the next untouched segment starts in the body
  let o = 0; // and in the output
  const same = (bodyFrom: number, bodyTo: number, outFrom: number) =>
    bodyTo >= bodyFrom &&
    outFrom + (bodyTo - bodyFrom) <= out.length &&
    body.subarray(bodyFrom, bodyTo).equals(out.subarray(outFrom, outFrom + (bodyTo - bodyFrom)));
  edits.forEach((e, k) => {
    const next = k + 1 < edits.length ? edits[k + 1]!.from : body.length;
    let placed = -1;
    for (let p = e.from; p <= e.to && placed < 0; p++) {
      const shifted = o + (p - a);
      if (
        same(a, p, o) &&
        out.subarray(shifted, shifted + e.bytes.length).equals(e.bytes) &&
        // the rest up to the next edit must line up too, or this offset is not the one
        same(p + e.removes, Math.max(p + e.removes, next), shifted + e.bytes.length)
      ) {
        placed = p;
      }
    }
    if (placed < 0) {
      throw new Error(`edit ${k} (${e.bytes.toString()}) does not fit ${out.toString()}`);
    }
    o += placed - a + e.bytes.length;
    a = placed + e.removes;
  });
  expect(same(a, body.length, o)).toBe(true);
  expect(o + (body.length - a)).toBe(out.length);
}
