// Graceful degradation of one pool: the smoothed load picks a profile (normal, tired,
// lazy, ...), and a job released in a degraded state has its body rewritten on the raw
// bytes: the profile's instruction joined to the system or first user message, and the token
// limit the client sent scaled (never one added where vLLM would run to the end of the
// context, nor changed where the output is grammar-constrained). The rest of the body is
// passed through byte for byte.
import {
  initialLoadState,
  loadSignal,
  nextLoadState,
  type LoadInputs,
  type LoadState,
} from '@sluice/admission';
import type { DegradationConfig } from '@sluice/config';
import { peekRequest, rewriteRequest, type RewritePlan } from '@sluice/openai';
import type { CompletionPath } from '@sluice/protocol';

export interface Degraded {
  /** What goes to the engine: the client's body, or its rewrite. */
  body: string | Buffer;
  /** The profile that applied (`x-sluice-load-state`). */
  state: string;
  degraded: boolean;
}

export class PoolLoad {
  private state: LoadState = initialLoadState();
  /** Each profile's edit per endpoint, built once: the config does not change. */
  private readonly plans: ReadonlyArray<Record<'chat' | 'completion', RewritePlan>>;

  constructor(private readonly config: DegradationConfig) {
    const plan = (
      profile: DegradationConfig['profiles'][number],
      endpoint: 'chat' | 'completion',
    ): RewritePlan => ({
      endpoint,
      ...(profile.instruction === undefined ? {} : { instruction: profile.instruction }),
      systemPrompt: config.systemPrompt,
      completionPrefix: config.completionPrefix,
      maxTokensFactor: profile.maxTokensFactor,
      // config.defaultMaxTokens is not passed: a limit the client left to the context window
      // is never set (vLLM refuses prompt + max_tokens > max_model_len, unknown here).
      minMaxTokens: config.minMaxTokens,
    });
    this.plans = config.profiles.map((p) => ({
      chat: plan(p, 'chat'),
      completion: plan(p, 'completion'),
    }));
  }

  get profile(): string {
    return this.config.profiles[this.state.index]?.name ?? 'normal';
  }

  get smoothed(): number | undefined {
    return this.state.smoothed;
  }

  /** Feeds one reading of the configured signal; true when the state changed. */
  update(inputs: LoadInputs): boolean {
    if (!this.config.enabled) return false;
    const before = this.state.index;
    this.state = nextLoadState(this.state, loadSignal(inputs, this.config.signal), this.config);
    return this.state.index !== before;
  }

  /** The body to send for a job released now. */
  apply(body: string | Buffer, path: CompletionPath, optOut: boolean): Degraded {
    const profile = this.config.profiles[this.state.index];
    if (
      !this.config.enabled ||
      !profile ||
      this.state.index === 0 ||
      (optOut && this.config.allowOptOut)
    )
      return { body, state: this.config.profiles[0]?.name ?? 'normal', degraded: false };
    const bytes = typeof body === 'string' ? Buffer.from(body) : body;
    const plans = this.plans[this.state.index]!;
    const rewritten = rewriteRequest(
      bytes,
      peekRequest(bytes),
      path === '/v1/chat/completions' ? plans.chat : plans.completion,
    );
    return { body: rewritten, state: profile.name, degraded: true };
  }
}
