// The table of values by id that stands in for a Map on the per-request path (id-table.ts):
// it answers as a Map would for any sequence of sets and deletes, ids that name Object's own
// properties included.
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { IdTable } from '../src/id-table.ts';

describe('IdTable', () => {
  it('sets, gets, counts and deletes', () => {
    const table = new IdTable<{ n: number }>();
    const one = { n: 1 };
    table.set('job-1', one);
    table.set('job-2', { n: 2 });
    table.set('job-1', one);
    expect(table.size).toBe(2);
    expect(table.get('job-1')).toBe(one);
    expect(table.has('job-2')).toBe(true);
    expect(table.delete('job-2')).toBe(true);
    expect(table.delete('job-2')).toBe(false);
    expect(table.has('job-2')).toBe(false);
    expect(table.get('job-2')).toBeUndefined();
    expect(table.size).toBe(1);
    expect(table.values()).toEqual([one]);
  });

  it("knows nothing of Object's own properties", () => {
    const table = new IdTable<number>();
    for (const id of ['__proto__', 'constructor', 'toString', 'hasOwnProperty'])
      expect([table.has(id), table.get(id), table.delete(id)]).toEqual([false, undefined, false]);
    table.set('__proto__', 7);
    expect([table.size, table.get('__proto__'), table.values()]).toEqual([1, 7, [7]]);
  });

  it('reads a snapshot: deleting while reading its values misses none', () => {
    const table = new IdTable<string>();
    for (const id of ['a', 'b', 'c']) table.set(id, id);
    const seen: string[] = [];
    for (const value of table.values()) {
      seen.push(value);
      table.delete(value === 'a' ? 'b' : 'c');
    }
    expect(seen.sort()).toEqual(['a', 'b', 'c']);
  });

  it('answers as a Map would for any sequence of sets and deletes', () => {
    const id = fc.constantFrom('a', 'b', '0', '17', '__proto__', 'constructor', 'valueOf');
    const op = fc.oneof(fc.record({ set: id, value: fc.integer() }), fc.record({ delete: id }));
    fc.assert(
      fc.property(fc.array(op, { maxLength: 60 }), (ops) => {
        const table = new IdTable<number>();
        const model = new Map<string, number>();
        for (const o of ops) {
          if ('set' in o) {
            table.set(o.set, o.value);
            model.set(o.set, o.value);
          } else expect(table.delete(o.delete)).toBe(model.delete(o.delete));
          expect(table.size).toBe(model.size);
        }
        for (const key of ['a', 'b', '0', '17', '__proto__', 'constructor', 'valueOf']) {
          expect(table.get(key)).toBe(model.get(key));
          expect(table.has(key)).toBe(model.has(key));
        }
        expect([...table.values()].sort()).toEqual([...model.values()].sort());
      }),
    );
  });
});
