// `n` and /v1/completions prompt batches, parsed into the engine sequences vLLM V1 fans a
// request out into (async_llm.py `add_request`, serving_completion.py).
import { describe, expect, it } from 'vitest';
import { parseSimRequest, SimRequestError } from '../src/openai-request.ts';

const chat = (extra: Record<string, unknown> = {}) =>
  parseSimRequest(
    'chat',
    { model: 'm', messages: [{ role: 'user', content: 'twelve chars' }], ...extra },
    'm',
    1000,
  );
const completion = (prompt: unknown, extra: Record<string, unknown> = {}) =>
  parseSimRequest('completion', { model: 'm', prompt, ...extra }, 'm', 1000);

function refusal(parse: () => unknown): SimRequestError {
  try {
    parse();
  } catch (err) {
    if (err instanceof SimRequestError) return err;
    throw err;
  }
  throw new Error('the request was accepted');
}

describe('n and prompt batches', () => {
  it('makes one sequence per choice of a chat request, counting the prompt once in usage', () => {
    const one = chat();
    const three = chat({ n: 3 });
    expect(three.n).toBe(3);
    expect(three.choices.map((c) => [c.index, c.promptIndex, c.choiceIndex])).toEqual([
      [0, 0, 0],
      [1, 0, 1],
      [2, 0, 2],
    ]);
    expect(three.choices.every((c) => c.promptTokens === 3)).toBe(true);
    // serving_chat.py: "num_prompt_tokens = len(final_res.prompt_token_ids)", once.
    expect(three.promptTokens).toBe(3);
    expect(new Set(three.choices.map((c) => c.seed)).size).toBe(3);
    // Choice 0 answers as the request with n = 1 does.
    expect(three.choices[0]!.seed).toBe(one.choices[0]!.seed);
    expect(one.seed).toBe(one.choices[0]!.seed);
    expect(three.seed).not.toBe(one.seed);
  });

  it('numbers a completions batch prompt_idx * n + choice_idx and counts each prompt once', () => {
    const req = completion(['abcd', 'abcdefgh'], { n: 2 });
    expect(req.numPrompts).toBe(2);
    expect(req.choices.map((c) => [c.index, c.promptIndex, c.choiceIndex, c.promptTokens])).toEqual(
      [
        [0, 0, 0, 1],
        [1, 0, 1, 1],
        [2, 1, 0, 2],
        [3, 1, 1, 2],
      ],
    );
    expect(req.promptTokens).toBe(3);
    // A batch element answers as the same prompt sent alone.
    expect(req.choices[2]!.seed).toBe(completion('abcdefgh').choices[0]!.seed);
    expect(req.choices[2]!.promptText).toBe('abcdefgh');
  });

  it("takes a batch of token-id prompts, and only vLLM's prompt forms", () => {
    const batch = completion([
      [1, 2, 3],
      [4, 5],
    ]);
    expect(batch.choices.map((c) => c.promptTokens)).toEqual([3, 2]);
    expect(batch.promptTokens).toBe(5);
    expect(batch.choices[1]!.seed).toBe(completion([4, 5]).choices[0]!.seed);
    expect(completion([1, 2, 3]).choices).toHaveLength(1);
    // protocol.py: "list[int] | list[list[int]] | str | list[str]", nothing mixed or empty.
    for (const prompt of [[], ['a', [1, 2]], [[1], []], [1, 'a']]) {
      const err = refusal(() => completion(prompt));
      expect(err.status).toBe(400);
      expect(err.param).toBe('prompt');
    }
  });

  it('seeds child i with seed + i, as parallel_sampling.py does', () => {
    const seeded = chat({ n: 3, seed: 40 });
    expect(seeded.choices[2]!.seed).toBe(chat({ seed: 42 }).choices[0]!.seed);
    expect(seeded.choices[0]!.seed).toBe(chat({ seed: 40 }).choices[0]!.seed);
  });

  it('applies sim_prompt_tokens and the context limit to every prompt of a batch', () => {
    expect(
      completion(['a', 'b'], { sim_prompt_tokens: 300 }).choices.map((c) => c.promptTokens),
    ).toEqual([300, 300]);
    const tooLong = refusal(() => completion(['a', 'x'.repeat(4000)], { max_tokens: 10 }));
    expect(tooLong.status).toBe(400);
    expect(tooLong.message).toMatch(/maximum context length is 1000 tokens/);
  });

  it.each([
    [{ n: 0 }, 'n must be at least 1, got 0.'],
    [{ n: -2 }, 'n must be at least 1, got -2.'],
    [{ n: 1.5 }, 'n must be an int, got 1.5'],
    [{ n: '2' }, 'n must be an int, got "2"'],
    [
      { n: 16_385 },
      'n must be at most 16384, got 16385. To increase this limit, set the VLLM_MAX_N_SEQUENCES environment variable.',
    ],
    [{ n: 2, temperature: 0 }, 'n must be 1 when using greedy sampling, got 2.'],
  ])('refuses %j as vLLM does', (extra, message) => {
    for (const parse of [() => chat(extra), () => completion('p', extra)]) {
      const err = refusal(parse);
      expect(err.status).toBe(400);
      expect(err.message).toBe(message);
    }
  });

  it('accepts n = 1 at temperature 0 and n > 1 at a sampling temperature', () => {
    expect(chat({ n: 1, temperature: 0 }).choices).toHaveLength(1);
    expect(chat({ n: 2, temperature: 0.7 }).choices).toHaveLength(2);
  });
});
