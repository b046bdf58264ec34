// --help of the commands configured by the environment: what they do, and every variable
// (the table @sluice/config keeps, so the help cannot drift from what is read).
import { describeVariables } from '@sluice/config';

const roles = {
  gateway:
    'Runs one gateway replica: the OpenAI-compatible HTTP edge (PORT) that queues requests in\n' +
    'Redis for the leading dispatcher and relays the answers. It listens at once: /healthz\n' +
    'answers 200, /readyz 503 until Redis, a leading dispatcher and the models are there.',
  dispatcher:
    'Runs a dispatcher: it leads or stands by for every pool (SLUICE_POOLS), releases queued\n' +
    'requests to the engines under the cap, and serves /metrics, /healthz, /readyz and the\n' +
    'read-only /status page on METRICS_PORT.',
} as const;

export function serviceHelp(command: keyof typeof roles): string {
  return [
    `Usage: sluice ${command}`,
    '',
    roles[command],
    '',
    'It takes no arguments: the environment configures it (SLUICE_CONFIG names an optional',
    'YAML file of pools). See README.md and libs/config/README.md. The variables:',
    '',
    describeVariables(),
    '',
  ].join('\n');
}
