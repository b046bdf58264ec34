import { CR, HASH } from './chars.js';
import { readCommentLine } from './comment.js';
import type { Cursor } from './cursor.js';
import { isLineEnd, skipBlanks } from './cursor.js';
import { createFamilyTable, noteSample } from './families.js';
import { readSample } from './sample.js';
import type { Exposition, Sample } from './types.js';

/**
 * Parses Prometheus text exposition format 0.0.4 in one forward pass.
 * Throws PrometheusParseError on the first malformed line; never returns part of a result.
 */
export function parseExposition(text: string): Exposition {
  const cur: Cursor = { text, pos: 0, line: 1 };
  const table = createFamilyTable();
  const samples: Sample[] = [];
  const length = text.length;
  while (cur.pos < length) {
    skipBlanks(cur);
    const pos = cur.pos;
    if (text.charCodeAt(pos) === HASH) {
      readCommentLine(cur, table);
    } else if (!isLineEnd(text, pos)) {
      const sample = readSample(cur);
      noteSample(table, sample.name);
      samples.push(sample);
    }
    // Every reader stops at a line end: `\n`, `\r\n`, a final `\r`, or the end of the text.
    if (text.charCodeAt(cur.pos) === CR) cur.pos++;
    if (cur.pos < length) {
      cur.pos++;
      cur.line++;
    }
  }
  return { samples, families: table.families };
}
