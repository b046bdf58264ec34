// The benchmark report writer's pure parts (test/bench/report.ts): charts and markdown.
import { describe, expect, it } from 'vitest';
import {
  chartsOf,
  comparisonTable,
  formatValue,
  renderReport,
  renderSummary,
  svgChart,
  ticks,
  type Machine,
  type StoredResult,
} from '../bench/report.ts';
import type { ScenarioResult } from '../bench/results.ts';

const machine: Machine = {
  cores: 2,
  cpu: 'Test CPU',
  memoryGiB: 8,
  node: 'v20.0.0',
  os: 'linux 6.0',
  date: '2026-10-01T12:00:00.000Z',
};

const incident: ScenarioResult = {
  scenario: 'incident',
  title: 'The incident',
  figures: [
    {
      name: 'direct: peak engine running + waiting',
      value: 191,
      unit: 'requests',
      goal: '<= 4 (the cap)',
      met: false,
    },
    { name: 'direct: short-request TTFT p50', value: 458.91, unit: 's (simulated)' },
    {
      name: 'Sluice: peak engine running + waiting',
      value: 4,
      unit: 'requests',
      goal: '<= 4 (the cap)',
      met: true,
    },
    { name: 'Sluice: short-request TTFT p50', value: 271.5, unit: 's (simulated)' },
  ],
  series: [
    {
      name: 'engine running + waiting: direct',
      unit: 'requests',
      points: [
        [0, 0],
        [1, 50],
        [2, 191],
      ],
    },
    {
      name: 'engine running + waiting: Sluice',
      unit: 'requests',
      points: [
        [0, 0],
        [0.5, 4],
        [1, 4],
        [1.5, 4],
        [2, 0],
      ],
    },
    { name: 'queue <depth>', unit: 'jobs', points: [[0, 3]] },
  ],
  runs: [{ n: 5, min: 1, median: 2, max: 4, unit: 'ms', of: 'added p50' }],
  notes: ['Simulated seconds.'],
};

const stored: StoredResult[] = [{ result: incident, writtenAt: '2026-10-01T11:59:00.000Z' }];

describe('report charts', () => {
  it('groups series by the prefix before ": " and draws one polyline per series with every point', () => {
    const charts = chartsOf(incident);
    expect(charts.map((c) => c.file)).toEqual([
      'incident-engine-running-waiting.svg',
      'incident-queue-depth.svg',
    ]);
    const svg = svgChart(charts[0]!);
    const polylines = [...svg.matchAll(/<polyline [^>]*points="([^"]*)"/g)];
    expect(polylines).toHaveLength(2);
    expect(polylines.map((p) => p[1]!.split(' ').length)).toEqual([3, 5]);
    expect(svg.startsWith('<svg xmlns="http://www.w3.org/2000/svg"')).toBe(true);
    expect(svg).toContain('>direct</text>');
    expect(svg).toContain('>Sluice</text>');
  });

  it('escapes labels and keeps every point inside the plot', () => {
    const [, queue] = chartsOf(incident);
    const svg = svgChart(queue!);
    expect(svg).toContain('queue &lt;depth&gt;');
    expect(svg).not.toContain('<depth>');
    const chart = chartsOf(incident)[0]!;
    const coords = [...svgChart(chart).matchAll(/points="([^"]*)"/g)].flatMap((m) =>
      m[1]!.split(' ').map((pair) => pair.split(',').map(Number)),
    );
    for (const [x, y] of coords) {
      expect(x).toBeGreaterThanOrEqual(64);
      expect(x).toBeLessThanOrEqual(760 - 190);
      expect(y).toBeGreaterThanOrEqual(34);
      expect(y).toBeLessThanOrEqual(360 - 48);
    }
  });

  it('keeps a label in the same colour in every chart of a scenario', () => {
    const points: Array<[number, number]> = [[0, 1]];
    const charts = chartsOf({
      scenario: 's',
      title: 's',
      figures: [],
      series: ['a: direct', 'a: Sluice', 'b: Sluice'].map((name) => ({ name, unit: 'x', points })),
    });
    expect(charts[1]!.lines[0]!.color).toBe(charts[0]!.lines[1]!.color);
    expect(charts[0]!.lines[0]!.color).not.toBe(charts[0]!.lines[1]!.color);
  });

  it('puts ticks 1, 2 or 5 times a power of ten apart, reaching the maximum', () => {
    expect(ticks(7)).toEqual([0, 2, 4, 6, 8]);
    expect(ticks(191)).toEqual([0, 50, 100, 150, 200]);
    expect(ticks(0.3)).toEqual([0, 0.1, 0.2, 0.3]);
    expect(ticks(0)).toEqual([0, 1]);
  });
});

describe('report markdown', () => {
  it('states the machine and marks an unmet goal NOT MET and a met one met', () => {
    const md = renderReport(stored, machine);
    expect(md).toContain('| Cores | 2 |');
    expect(md).toContain('| Node | v20.0.0 |');
    expect(md).toContain(
      '| direct: peak engine running + waiting | 191 | requests | <= 4 (the cap) | **NOT MET** |',
    );
    expect(md).toContain(
      '| Sluice: peak engine running + waiting | 4 | requests | <= 4 (the cap) | met |',
    );
    expect(md).toContain('1 of 2 figures with a goal did NOT meet it');
    expect(md).toContain('| added p50 | 5 | 1 | 2 | 4 | ms | 150 % |');
    expect(md).toContain('![engine running + waiting](incident-engine-running-waiting.svg)');
    expect(md).toContain('- Simulated seconds.');
  });

  it('compares setups side by side when figures are named "<setup>: <measure>"', () => {
    const matrix = comparisonTable(incident.figures)!;
    expect(matrix.split('\n')).toEqual([
      '|  | peak engine running + waiting (requests) | short-request TTFT p50 (s) |',
      '| --- | --- | --- |',
      '| direct | 191 (NOT MET) | 458.9 |',
      '| Sluice | 4 (met) | 271.5 |',
    ]);
    expect(comparisonTable([{ name: 'no setup', value: 1, unit: 'ms' }])).toBeUndefined();
  });

  it('summarises the goals with the date and the machine', () => {
    const md = renderSummary(stored, machine);
    expect(md).toContain('2026-10-01, on 2 cores (Test CPU), 8 GiB, Node v20.0.0');
    expect(md).toContain(
      '| incident | direct: peak engine running + waiting | 191 requests | <= 4 (the cap) | **NOT MET** |',
    );
    expect(md).toContain('| direct | 191 (NOT MET) | 458.9 |');
    expect(md).toContain('[report.md](report.md)');
  });

  it('names the bottleneck in the report and the summary, and draws extra tables', () => {
    const overhead: ScenarioResult = {
      scenario: 'overhead',
      title: 'Overhead',
      figures: [{ name: 'added p50', value: 3, unit: 'ms', goal: '<= 1 ms', met: false }],
      bottleneck: 'Eleven process hops.',
      tables: [{ title: 'Stages', head: ['Stage', 'ms'], rows: [['gateway.request', '0.4']] }],
    };
    const both: StoredResult[] = [...stored, { result: overhead, writtenAt: machine.date }];
    const report = renderReport(both, machine);
    expect(report).toContain('**Bottleneck found.** Eleven process hops.');
    expect(report).toContain('Stages:\n\n| Stage | ms |\n| --- | --- |\n| gateway.request | 0.4 |');
    expect(renderSummary(both, machine)).toContain(
      '**Bottleneck (overhead).** Eleven process hops.',
    );
    expect(renderSummary(stored, machine)).not.toContain('Bottleneck');
  });

  it('lists the findings under the comparison, in the report and the summary', () => {
    const withFindings: StoredResult[] = [
      { result: { ...incident, findings: ['Goal: **MET**, 6.2x.'] }, writtenAt: machine.date },
    ];
    expect(renderReport(withFindings, machine)).toContain(
      '| Sluice | 4 (met) | 271.5 |\n\n- Goal: **MET**, 6.2x.\n',
    );
    expect(renderSummary(withFindings, machine)).toContain(
      '| Sluice | 4 (met) | 271.5 |\n\n- Goal: **MET**, 6.2x.\n',
    );
    expect(renderSummary(stored, machine)).not.toContain('- Goal');
  });

  it('shows the fairness runs side by side in the summary, with their findings', () => {
    const fairness: ScenarioResult = {
      scenario: 'fairness',
      title: 'Fairness',
      figures: [
        { name: 'light alone: light TTFT p99', value: 12.5, unit: 'ms' },
        { name: 'light alone: failed or incomplete', value: 0, unit: 'requests' },
        { name: 'fair share: light TTFT p99', value: 30, unit: 'ms' },
        { name: 'fair share: heavy served', value: 50.2, unit: 'req/s' },
      ],
      findings: ['Fair share: 2.4x alone.'],
    };
    const md = renderSummary([...stored, { result: fairness, writtenAt: machine.date }], machine);
    expect(md).toContain(
      [
        '## Fairness',
        '',
        '|  | light TTFT p99 (ms) | heavy served (req/s) |',
        '| --- | --- | --- |',
        '| light alone | 12.5 |  |',
        '| fair share | 30 | 50.2 |',
        '',
        '- Fair share: 2.4x alone.',
      ].join('\n'),
    );
    expect(renderSummary(stored, machine)).not.toContain('Fairness');
  });

  it('formats values for tables', () => {
    expect(formatValue(12345)).toBe('12,345');
    expect(formatValue(1.23456)).toBe('1.23');
    expect(formatValue(0.012345)).toBe('0.0123');
    expect(formatValue(456.789)).toBe('456.8');
    expect(formatValue(Number.NaN)).toBe('n/a');
  });
});
