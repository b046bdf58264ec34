import { PrometheusParseError } from './errors.js';
import type { MetricFamily, MetricType } from './types.js';

interface MutableFamily {
  name: string;
  type: MetricType;
  help?: string;
}

/** What the TYPE and HELP lines declared so far, and which sample names were seen. */
export interface FamilyTable {
  readonly families: Map<string, MetricFamily>;
  /** Families that had a TYPE line (a HELP-only family is 'untyped' but may still get one). */
  readonly typed: Set<string>;
  readonly sampleNames: Set<string>;
  lastSampleName: string;
}

export const METRIC_TYPES: ReadonlySet<string> = new Set<MetricType>([
  'counter',
  'gauge',
  'histogram',
  'summary',
  'untyped',
  'info',
  'stateset',
  'gaugehistogram',
  'unknown',
]);

/** The sample names a family of each type owns, as suffixes of the family name. */
const OWNED_SUFFIXES: Readonly<Record<MetricType, readonly string[]>> = {
  counter: ['', '_total', '_created'],
  gauge: [''],
  histogram: ['', '_bucket', '_sum', '_count', '_created'],
  summary: ['', '_sum', '_count', '_created'],
  untyped: [''],
  info: ['', '_info'],
  stateset: [''],
  gaugehistogram: ['', '_bucket', '_gsum', '_gcount'],
  unknown: [''],
};

export function createFamilyTable(): FamilyTable {
  return { families: new Map(), typed: new Set(), sampleNames: new Set(), lastSampleName: '' };
}

/** Records a sample name; a run of samples with one name costs one comparison each. */
export function noteSample(table: FamilyTable, name: string): void {
  if (name === table.lastSampleName) return;
  table.lastSampleName = name;
  table.sampleNames.add(name);
}

export function declareType(table: FamilyTable, name: string, type: MetricType, line: number) {
  if (table.typed.has(name)) {
    throw new PrometheusParseError(line, `second TYPE line for metric family "${name}"`);
  }
  for (const suffix of OWNED_SUFFIXES[type]) {
    if (table.sampleNames.has(name + suffix)) {
      throw new PrometheusParseError(
        line,
        `TYPE line for metric family "${name}" comes after its sample "${name + suffix}"`,
      );
    }
  }
  table.typed.add(name);
  const family = familyOf(table, name);
  family.type = type;
}

export function declareHelp(table: FamilyTable, name: string, help: string, line: number) {
  const family = familyOf(table, name);
  if (family.help !== undefined) {
    throw new PrometheusParseError(line, `second HELP line for metric family "${name}"`);
  }
  family.help = help;
}

function familyOf(table: FamilyTable, name: string): MutableFamily {
  let family = table.families.get(name) as MutableFamily | undefined;
  if (family === undefined) {
    family = { name, type: 'untyped' };
    table.families.set(name, family);
  }
  return family;
}
