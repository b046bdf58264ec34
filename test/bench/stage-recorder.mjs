// Loaded with `--import` into the gateway and dispatcher by the overhead scenario's latency
// breakdown: keeps every stage mark in memory (no I/O while requests run) and writes them to
// `$SLUICE_STAGE_FILE.<pid>`, one `<hrtime ns> <stage>` line each, when the process exits.
import { subscribe } from 'node:diagnostics_channel';
import { writeFileSync } from 'node:fs';
import { STAGE_CHANNEL } from '../../libs/observability/dist/stages.js';

const at = [];
const stages = [];
subscribe(STAGE_CHANNEL, (mark) => {
  at.push(mark.at);
  stages.push(mark.stage);
});
process.on('exit', () => {
  const lines = at.map((t, i) => `${t} ${stages[i]}\n`);
  writeFileSync(`${process.env.SLUICE_STAGE_FILE}.${process.pid}`, lines.join(''));
});
