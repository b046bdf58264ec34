// Cancels for the dispatcher, over the cancel channel. A cancel that reached no subscriber
// (the dispatcher is reconnecting after a Redis outage, or a standby is taking over) or that
// failed is sent again, a second apart, for a while: an engine slot held for nobody costs
// more than a few repeated publishes.
import { encodeCancel } from '@sluice/protocol';
import type { Redis } from '@sluice/redis';

export interface CancelPublisherOptions {
  attempts?: number;
  retryMs?: number;
  /**
   * PUBLISH answers how many subscribers heard it. Not on a Redis Cluster: there it counts only
   * the node that took the PUBLISH, while the dispatcher may listen on another; false there.
   */
  countsReceivers?: boolean;
  onGiveUp(jobId: string, err: unknown): void;
}

export function cancelPublisher(
  redis: Redis,
  channel: string,
  { attempts = 10, retryMs = 1000, countsReceivers = true, onGiveUp }: CancelPublisherOptions,
): (jobId: string, reason: string) => void {
  return (jobId, reason) => {
    let attempt = 0;
    const send = (): void => {
      attempt += 1;
      const retry = (err: unknown) => {
        if (attempt >= attempts) return onGiveUp(jobId, err);
        setTimeout(send, retryMs).unref();
      };
      redis.publish(channel, encodeCancel(jobId, reason)).then((receivers) => {
        if (receivers === 0 && countsReceivers)
          retry(new Error('no dispatcher subscribed to the cancel channel'));
      }, retry);
    };
    send();
  };
}
