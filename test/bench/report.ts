// The report writer: reads every bench/results/<scenario>.json and writes
//   bench/results/report.md         the machine, one section per scenario (figures with their
//                                   goals, noise of repeated runs, notes, charts);
//   bench/results/summary.md        the few headline figures, with the date and machine;
//   bench/results/<scenario>-<chart>.svg  line charts of the series.
// Series whose names share a prefix before ': ' ("engine running + waiting: direct") are drawn
// in one chart named after the prefix, one line each; any other series gets a chart of its own.
// The functions that turn results into text are pure; `writeReport` does the file work.
import {
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { availableParallelism, cpus, platform, release, totalmem } from 'node:os';
import { join } from 'node:path';
import { resultsDir, type Figure, type ScenarioResult, type Series } from './results.ts';

export interface Machine {
  cores: number;
  cpu: string;
  memoryGiB: number;
  node: string;
  os: string;
  date: string;
}

export function machineInfo(now = new Date()): Machine {
  return {
    cores: availableParallelism(),
    cpu: cpus()[0]?.model.trim() || 'unknown CPU',
    memoryGiB: Math.round((totalmem() / 2 ** 30) * 10) / 10,
    node: process.version,
    os: `${platform()} ${release()}`,
    date: now.toISOString(),
  };
}

export const machineLine = (m: Machine) =>
  `${m.cores} cores (${m.cpu}), ${m.memoryGiB} GiB, Node ${m.node}, ${m.os}`;

/** A result as read from disk, with when it was written. */
export interface StoredResult {
  result: ScenarioResult;
  writtenAt: string;
}

// ---- numbers and markdown -------------------------------------------------------------

/** A figure's value for a table: grouped thousands, a few significant digits, n/a for NaN. */
export function formatValue(value: number): string {
  if (!Number.isFinite(value)) return 'n/a';
  if (Number.isInteger(value)) return value.toLocaleString('en-US');
  const abs = Math.abs(value);
  const digits = abs >= 100 ? 1 : abs >= 1 ? 2 : 3;
  return abs >= 1
    ? value.toLocaleString('en-US', { maximumFractionDigits: digits })
    : String(Number(value.toPrecision(digits)));
}

const cell = (text: string) => text.replaceAll('|', '\\|').replaceAll('\n', ' ');

function table(head: string[], rows: string[][]): string {
  return [
    `| ${head.map(cell).join(' | ')} |`,
    `| ${head.map(() => '---').join(' | ')} |`,
    ...rows.map((row) => `| ${row.map(cell).join(' | ')} |`),
  ].join('\n');
}

/** How a figure stands against its goal, in words: met, NOT MET, or not judged. */
export function verdict(figure: Figure): string {
  if (figure.goal === undefined) return '';
  if (figure.met === true) return 'met';
  if (figure.met === false) return '**NOT MET**';
  return 'not judged';
}

function figuresTable(figures: Figure[]): string {
  return table(
    ['Figure', 'Value', 'Unit', 'Goal', 'Met', 'Note'],
    figures.map((f) => [
      f.name,
      formatValue(f.value),
      f.unit,
      f.goal ?? '',
      verdict(f),
      f.note ?? '',
    ]),
  );
}

function runsTable(runs: NonNullable<ScenarioResult['runs']>): string {
  return table(
    ['Of', 'Runs', 'Min', 'Median', 'Max', 'Unit', 'Spread (max - min) / median'],
    runs.map((r) => [
      r.of,
      String(r.n),
      formatValue(r.min),
      formatValue(r.median),
      formatValue(r.max),
      r.unit,
      r.median === 0 ? 'n/a' : `${formatValue(((r.max - r.min) / r.median) * 100)} %`,
    ]),
  );
}

/**
 * Figures named `<setup>: <measure>` for two or more setups, as a setups x measures table;
 * undefined when the figures are not of that shape.
 */
export function comparisonTable(figures: Figure[], measures?: string[]): string | undefined {
  const rows = new Map<string, Map<string, Figure>>();
  const columns: string[] = [];
  for (const f of figures) {
    const at = f.name.indexOf(': ');
    if (at === -1) return undefined;
    const setup = f.name.slice(0, at);
    const measure = f.name.slice(at + 2);
    if (measures && !measures.includes(measure)) continue;
    if (!columns.includes(measure)) columns.push(measure);
    if (!rows.has(setup)) rows.set(setup, new Map());
    rows.get(setup)!.set(measure, f);
  }
  if (rows.size < 2 || columns.length === 0) return undefined;
  const unitOf = (m: string) =>
    [...rows.values()]
      .find((r) => r.has(m))
      ?.get(m)
      ?.unit.replace(/ \(.*\)$/, '') ?? '';
  return table(
    ['', ...columns.map((m) => (unitOf(m) ? `${m} (${unitOf(m)})` : m))],
    [...rows].map(([setup, byMeasure]) => [
      setup,
      ...columns.map((m) => {
        const f = byMeasure.get(m);
        if (!f) return '';
        const mark =
          f.goal === undefined || f.met === undefined ? '' : f.met ? ' (met)' : ' (NOT MET)';
        return `${formatValue(f.value)}${mark}`;
      }),
    ]),
  );
}

// ---- charts -----------------------------------------------------------------------------

export interface Chart {
  /** File name under bench/results/. */
  file: string;
  title: string;
  unit: string;
  /** Lines: the label drawn in the legend, its colour, and the series. */
  lines: Array<{ label: string; color: string; series: Series }>;
}

const palette = ['#d62728', '#ff7f0e', '#1f77b4', '#7f7f7f', '#2ca02c', '#9467bd', '#8c564b'];

export const slug = (text: string) =>
  text
    .toLowerCase()
    .replace(/[^a-z0-9]+/g, '-')
    .replace(/^-+|-+$/g, '') || 'series';

/**
 * The charts of one scenario: series grouped by the prefix of their names before ': '. A label
 * keeps its colour in every chart of the scenario.
 */
export function chartsOf(result: ScenarioResult): Chart[] {
  const charts = new Map<string, Chart>();
  const colors = new Map<string, string>();
  for (const series of result.series ?? []) {
    const at = series.name.indexOf(': ');
    const group = at === -1 ? series.name : series.name.slice(0, at);
    const label = at === -1 ? series.name : series.name.slice(at + 2);
    const file = `${slug(result.scenario)}-${slug(group)}.svg`;
    if (!charts.has(file)) charts.set(file, { file, title: group, unit: series.unit, lines: [] });
    if (!colors.has(label)) colors.set(label, palette[colors.size % palette.length]!);
    charts.get(file)!.lines.push({ label, color: colors.get(label)!, series });
  }
  return [...charts.values()];
}

/** Tick values from 0 to at least `max`: 1, 2 or 5 times a power of ten apart, about `count`. */
export function ticks(max: number, count = 5): number[] {
  if (!(max > 0)) return [0, 1];
  const raw = max / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = ([1, 2, 5, 10].find((m) => m * power >= raw) ?? 10) * power;
  const out: number[] = [];
  for (let i = 0; out.at(-1) === undefined || out.at(-1)! < max; i += 1)
    out.push(Number((i * step).toPrecision(12)));
  return out;
}

const escapeXml = (text: string) =>
  text
    .replaceAll('&', '&amp;')
    .replaceAll('<', '&lt;')
    .replaceAll('>', '&gt;')
    .replaceAll('"', '&quot;');

/** An SVG line chart: one polyline per line, axes from 0 with ticks, a legend on the right. */
export function svgChart(chart: Chart, xLabel = 'seconds'): string {
  const width = 760;
  const height = 360;
  const m = { left: 64, right: 190, top: 34, bottom: 48 };
  const plotW = width - m.left - m.right;
  const plotH = height - m.top - m.bottom;
  const points = chart.lines.flatMap((l) => l.series.points);
  const xTicks = ticks(Math.max(0, ...points.map((p) => p[0])));
  const yTicks = ticks(Math.max(0, ...points.map((p) => p[1])));
  const xMax = xTicks.at(-1)!;
  const yMax = yTicks.at(-1)!;
  const x = (v: number) => (m.left + (v / xMax) * plotW).toFixed(1);
  const y = (v: number) => (m.top + plotH - (v / yMax) * plotH).toFixed(1);
  const out: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="sans-serif" font-size="12">`,
    `<rect width="${width}" height="${height}" fill="#ffffff"/>`,
    `<text x="${m.left}" y="20" font-size="14" font-weight="bold">${escapeXml(chart.title)}</text>`,
  ];
  for (const t of yTicks)
    out.push(
      `<line x1="${m.left}" y1="${y(t)}" x2="${m.left + plotW}" y2="${y(t)}" stroke="#e5e5e5"/>`,
      `<text x="${m.left - 6}" y="${y(t)}" text-anchor="end" dominant-baseline="middle">${formatValue(t)}</text>`,
    );
  for (const t of xTicks)
    out.push(
      `<line x1="${x(t)}" y1="${m.top + plotH}" x2="${x(t)}" y2="${m.top + plotH + 5}" stroke="#333333"/>`,
      `<text x="${x(t)}" y="${m.top + plotH + 18}" text-anchor="middle">${formatValue(t)}</text>`,
    );
  out.push(
    `<line x1="${m.left}" y1="${m.top}" x2="${m.left}" y2="${m.top + plotH}" stroke="#333333"/>`,
    `<line x1="${m.left}" y1="${m.top + plotH}" x2="${m.left + plotW}" y2="${m.top + plotH}" stroke="#333333"/>`,
    `<text x="${m.left + plotW / 2}" y="${height - 8}" text-anchor="middle">${escapeXml(xLabel)}</text>`,
    `<text transform="translate(16 ${m.top + plotH / 2}) rotate(-90)" text-anchor="middle">${escapeXml(chart.unit)}</text>`,
  );
  chart.lines.forEach((line, i) => {
    const { color } = line;
    const coords = line.series.points.map(([px, py]) => `${x(px)},${y(py)}`).join(' ');
    out.push(`<polyline fill="none" stroke="${color}" stroke-width="1.5" points="${coords}"/>`);
    const ly = m.top + 8 + i * 18;
    const lx = m.left + plotW + 14;
    out.push(
      `<line x1="${lx}" y1="${ly}" x2="${lx + 18}" y2="${ly}" stroke="${color}" stroke-width="2"/>`,
      `<text x="${lx + 24}" y="${ly}" dominant-baseline="middle">${escapeXml(line.label)}</text>`,
    );
  });
  out.push('</svg>');
  return `${out.join('\n')}\n`;
}

// ---- the documents --------------------------------------------------------------------

/** The order of sections: the issue's order, then anything else by name. */
const ORDER = ['overhead', 'relay', 'parked', 'body', 'incident'];

export function sortResults(stored: StoredResult[]): StoredResult[] {
  const rank = (s: StoredResult) => {
    const i = ORDER.indexOf(s.result.scenario);
    return i === -1 ? ORDER.length : i;
  };
  return [...stored].sort(
    (a, b) => rank(a) - rank(b) || a.result.scenario.localeCompare(b.result.scenario),
  );
}

/** The x axis of a scenario's charts. */
const xLabelOf = (scenario: string) => (scenario === 'incident' ? 'simulated seconds' : 'seconds');

export function renderReport(stored: StoredResult[], machine: Machine): string {
  const out: string[] = [
    '# Sluice benchmark report',
    '',
    `Generated ${machine.date} by \`npm run bench\`. Every figure was measured on this machine, each`,
    'against its baseline in the same run; wall-clock figures are not comparable across machines.',
    '',
    '## Machine',
    '',
    table(
      ['', ''],
      [
        ['Cores', String(machine.cores)],
        ['CPU', machine.cpu],
        ['Memory', `${machine.memoryGiB} GiB`],
        ['Node', machine.node],
        ['OS', machine.os],
        ['Date', machine.date],
      ],
    ),
    '',
  ];
  const goals = stored.flatMap((s) => s.result.figures.filter((f) => f.goal !== undefined));
  const unmet = goals.filter((f) => f.met === false);
  out.push(
    '## Goals',
    '',
    goals.length === 0
      ? 'No figure in these results carries a goal.'
      : unmet.length === 0
        ? `All ${goals.length} figures with a goal met it.`
        : `${unmet.length} of ${goals.length} figures with a goal did NOT meet it: ${unmet.map((f) => `${f.name} (${formatValue(f.value)} ${f.unit}; goal ${f.goal})`).join('; ')}.`,
    '',
  );
  if (stored.length === 0) out.push('No results found in bench/results/.', '');
  for (const { result, writtenAt } of sortResults(stored)) {
    out.push(
      `## ${result.title}`,
      '',
      `Scenario \`${result.scenario}\`, written ${writtenAt}.`,
      '',
    );
    const comparison = comparisonTable(result.figures);
    if (comparison) out.push(comparison, '');
    if (result.findings && result.findings.length > 0)
      out.push(...result.findings.map((f) => `- ${f}`), '');
    out.push(result.figures.length === 0 ? 'No figures.' : figuresTable(result.figures), '');
    if (result.bottleneck) out.push(`**Bottleneck found.** ${result.bottleneck}`, '');
    for (const t of result.tables ?? []) out.push(`${t.title}:`, '', table(t.head, t.rows), '');
    if (result.runs && result.runs.length > 0)
      out.push('Noise of repeated runs:', '', runsTable(result.runs), '');
    for (const chart of chartsOf(result)) out.push(`![${chart.title}](${chart.file})`, '');
    if (result.notes && result.notes.length > 0)
      out.push('Notes:', '', ...result.notes.map((n) => `- ${n}`), '');
  }
  return `${out.join('\n').trimEnd()}\n`;
}

/** Measures of the incident shown in the summary, one row per setup (and engine flag set). */
const INCIDENT_HEADLINE = [
  'peak engine running + waiting',
  'short-request TTFT p50',
  'short-request TTFT p99',
  'short TTFT p99, times better than direct',
  'median long prompt done',
  'last long prompt done',
  'refusals',
  'total completion time',
];

/** Measures of the fairness scenario shown in the summary, one row per run. */
const FAIRNESS_HEADLINE = [
  'light TTFT p50',
  'light TTFT p90',
  'light TTFT p99',
  'light TTFT p99 / alone',
  'light TTFT p99 / fair share',
  'heavy served',
  'peak engine running + waiting',
];

export function renderSummary(stored: StoredResult[], machine: Machine): string {
  const out: string[] = [
    '# Benchmark summary',
    '',
    `Latest \`npm run bench\`: ${machine.date.slice(0, 10)}, on ${machineLine(machine)}.`,
    'Full figures, notes and charts: [report.md](report.md).',
    '',
  ];
  const goals = sortResults(stored).flatMap(({ result }) =>
    result.figures
      .filter((f) => f.goal !== undefined)
      .map((f) => ({ scenario: result.scenario, f })),
  );
  if (goals.length > 0)
    out.push(
      table(
        ['Scenario', 'Figure', 'Value', 'Goal', 'Met'],
        goals.map(({ scenario, f }) => [
          scenario,
          f.name,
          `${formatValue(f.value)} ${f.unit}`,
          f.goal ?? '',
          verdict(f),
        ]),
      ),
      '',
    );
  for (const { result } of sortResults(stored))
    if (result.bottleneck)
      out.push(`**Bottleneck (${result.scenario}).** ${result.bottleneck}`, '');
  const incident = stored.find((s) => s.result.scenario === 'incident')?.result;
  const matrix = incident && comparisonTable(incident.figures, INCIDENT_HEADLINE);
  if (incident && matrix) {
    out.push(`## ${incident.title}`, '', 'Times in simulated seconds.', '', matrix, '');
    if (incident.findings && incident.findings.length > 0)
      out.push(...incident.findings.map((f) => `- ${f}`), '');
  }
  const fairness = stored.find((s) => s.result.scenario === 'fairness')?.result;
  const fairMatrix = fairness && comparisonTable(fairness.figures, FAIRNESS_HEADLINE);
  if (fairness && fairMatrix) {
    out.push(`## ${fairness.title}`, '', fairMatrix, '');
    if (fairness.findings && fairness.findings.length > 0)
      out.push(...fairness.findings.map((f) => `- ${f}`), '');
  }
  if (stored.length === 0) out.push('No results yet.', '');
  return `${out.join('\n').trimEnd()}\n`;
}

// ---- files ----------------------------------------------------------------------------

export function readResults(dir = resultsDir): StoredResult[] {
  if (!existsSync(dir)) return [];
  return readdirSync(dir)
    .filter((name) => name.endsWith('.json'))
    .map((name) => {
      const path = join(dir, name);
      const result = JSON.parse(readFileSync(path, 'utf8')) as ScenarioResult;
      return { result, writtenAt: statSync(path).mtime.toISOString() };
    });
}

/** Writes report.md, summary.md and the charts; returns the paths written. */
export function writeReport(dir = resultsDir, machine = machineInfo()): string[] {
  mkdirSync(dir, { recursive: true });
  const stored = readResults(dir);
  // Charts are generated: drop those of earlier runs so none outlives its data.
  for (const name of readdirSync(dir)) if (name.endsWith('.svg')) rmSync(join(dir, name));
  const written: string[] = [];
  const write = (name: string, text: string) => {
    const path = join(dir, name);
    writeFileSync(path, text);
    written.push(path);
  };
  for (const { result } of stored)
    for (const chart of chartsOf(result))
      write(chart.file, svgChart(chart, xLabelOf(result.scenario)));
  write('report.md', renderReport(stored, machine));
  write('summary.md', renderSummary(stored, machine));
  return written;
}
