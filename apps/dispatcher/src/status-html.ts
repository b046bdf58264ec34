// The /status page: static HTML and one small script that polls status.json every second
// and redraws. Everything from the JSON goes in with textContent, never as markup. The
// script is plain JavaScript kept in a string: the page has no build step of its own.
import { createHash } from 'node:crypto';

const script = `'use strict';
const $ = (id) => document.getElementById(id);
function el(tag, text, attrs) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
  return node;
}
function age(ms) {
  if (typeof ms !== 'number' || !(ms >= 0)) return '?';
  if (ms < 10000) return (ms / 1000).toFixed(1) + ' s';
  if (ms < 120000) return Math.round(ms / 1000) + ' s';
  return Math.round(ms / 60000) + ' min';
}
function field(parent, label, value, name, cls) {
  const box = el('div', undefined, { class: 'field' + (cls ? ' ' + cls : '') });
  box.append(el('span', label, { class: 'label' }), el('span', value, { 'data-field': name, class: 'value' }));
  parent.append(box);
}
function table(headers, rows) {
  const t = el('table');
  const head = el('tr');
  for (const h of headers) head.append(el('th', h));
  t.append(head);
  for (const cells of rows) {
    const tr = el('tr');
    for (const [text, cls] of cells) tr.append(el('td', text, cls ? { class: cls } : {}));
    t.append(tr);
  }
  return t;
}
function engineRows(engines, now) {
  return engines.map((e) => [
    [e.name],
    [e.inflight + ' / ' + e.cap],
    e.open === undefined ? ['?'] : e.open ? ['open', 'ok'] : ['closed: ' + (e.reason || 'unknown'), 'warn'],
    [e.health || 'unknown', e.health === 'stale' ? 'bad' : ''],
    [e.running === undefined ? '-' : e.running],
    [e.waiting === undefined ? '-' : e.waiting],
    [e.kvUsage === undefined ? '-' : (e.kvUsage * 100).toFixed(1) + ' %'],
    [e.scrapedAt === undefined ? 'never' : age(now - e.scrapedAt) + ' ago'],
  ]);
}
function pool(p, now, role) {
  const s = p.stats;
  const section = el('section', undefined, { class: 'pool', 'data-pool': p.pool });
  const title = el('h2', p.pool);
  const mode = s ? s.mode || 'open' : 'no leader';
  title.append(el('span', mode, { class: 'mode ' + mode.replace(' ', '-'), 'data-field': 'mode' }));
  section.append(title);
  if (!s) {
    section.append(el('p', p.invalid ? 'unreadable stats: ' + p.invalid : 'no leader: nothing published for 5 s', { class: 'bad' }));
    return section;
  }
  const meta = el('div', undefined, { class: 'fields' });
  field(meta, 'leader', s.leader, 'leader');
  field(meta, 'load', s.loadState || '-', 'load');
  field(meta, 'released', s.drainPerSecond.toFixed(2) + ' /s', 'drain');
  field(meta, 'published', age(now - s.at) + ' ago', 'published');
  field(meta, 'this dispatcher', role || 'not contending', 'role');
  section.append(meta);
  const q = s.queue;
  const queue = el('div', undefined, { class: 'fields queue' });
  if (q) {
    const held = q.delayed || 0;
    field(queue, 'queued', q.wait + q.prioritized + held, 'queued', 'big');
    field(queue, 'waiting', q.wait, 'queue-wait');
    field(queue, 'prioritized', q.prioritized, 'queue-prioritized');
    field(queue, 'held', held, 'queue-held');
    field(queue, 'active', q.active, 'active', 'big');
  } else field(queue, 'queued', '?', 'queued', 'big');
  if (s.oldestQueuedMs !== undefined) field(queue, 'oldest queued', age(s.oldestQueuedMs), 'oldest', 'big');
  section.append(queue);
  section.append(table(['engine', 'in flight / cap', 'gate', 'state', 'running', 'waiting', 'KV cache', 'gauges read'], engineRows(s.engines, now)));
  const longs = s.longs;
  if (longs && (longs.held > 0 || longs.inPrefill > 0))
    section.append(el('p', 'long prompts: ' + longs.held + ' held (' + longs.heldTokens + ' tokens), ' + longs.inPrefill + ' in prefill'));
  const tenants = Object.entries(s.tenants || {});
  if (tenants.length > 0)
    section.append(table(['tenant', 'queued', 'in flight', 'weight'], tenants.map(([name, t]) => [[name], [t.queued], [t.inflight], [t.weight]])));
  return section;
}
function render(data) {
  const d = data.dispatcher;
  const leads = d.leading.length > 0 ? 'leads ' + d.leading.join(', ') : 'leads no pool';
  const standby = d.standby.length > 0 ? '; stands by for ' + d.standby.join(', ') : '';
  $('served').textContent = 'served by dispatcher ' + d.id + ' (' + leads + standby + ')' + (d.redis ? '' : '; Redis not connected');
  $('served').dataset.leads = String(d.leading.length > 0);
  const roles = {};
  for (const name of d.leading) roles[name] = 'leader';
  for (const name of d.standby) roles[name] = 'standby';
  const sections = data.pools.map((p) => pool(p, data.now, roles[p.pool]));
  if (data.error) sections.unshift(el('p', 'cannot read the pools: ' + data.error, { class: 'bad' }));
  else if (sections.length === 0) sections.push(el('p', 'no pools yet'));
  $('pools').replaceChildren(...sections);
  $('updated').textContent = 'updated ' + new Date(data.now).toLocaleTimeString();
}
async function tick() {
  try {
    const res = await fetch('status.json', { cache: 'no-store' });
    if (!res.ok) throw new Error('HTTP ' + res.status);
    render(await res.json());
    document.body.dataset.state = 'ok';
  } catch (err) {
    $('updated').textContent = 'cannot reach the dispatcher: ' + (err && err.message);
    document.body.dataset.state = 'error';
  }
  setTimeout(tick, 1000);
}
tick();
`;

const style = `
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5rem; color: #1d2430; background: #f6f7f9; }
h1 { font-size: 1.3rem; margin: 0 0 .2rem; }
header p { margin: 0; color: #555; }
body[data-state=error] #updated { color: #b3261e; font-weight: 600; }
.pool { background: #fff; border: 1px solid #d9dde3; border-radius: 6px; padding: .8rem 1rem; margin: 1rem 0; }
.pool h2 { font-size: 1.15rem; margin: 0 0 .5rem; display: flex; gap: .6rem; align-items: center; }
.mode { font-size: .8rem; padding: .1rem .5rem; border-radius: 1rem; background: #e3f1e6; color: #1b5e20; }
.mode.paused, .mode.draining { background: #fff1d6; color: #7a4b00; }
.mode.no-leader { background: #fde2e0; color: #b3261e; }
.fields { display: flex; flex-wrap: wrap; gap: .3rem 1.4rem; margin: .3rem 0; }
.field .label { color: #666; margin-right: .35rem; }
.field.big .value { font-size: 1.6rem; font-weight: 600; }
.queue { align-items: baseline; margin: .6rem 0; }
table { border-collapse: collapse; margin-top: .5rem; }
th, td { text-align: left; padding: .2rem .8rem .2rem 0; border-bottom: 1px solid #eceef1; }
th { color: #666; font-weight: 500; }
.ok { color: #1b5e20; }
.bad { color: #b3261e; }
.warn { color: #8a5300; }
`;

/** The Content-Security-Policy: only this exact script runs, and it may only fetch this server. */
export const statusPageCsp =
  `default-src 'none'; script-src 'sha256-${createHash('sha256').update(script).digest('base64')}'; ` +
  `style-src 'unsafe-inline'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'`;

export const statusPageHtml = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Sluice status</title>
<style>${style}</style>
</head>
<body data-state="loading">
<header>
<h1>Sluice status</h1>
<p id="served">loading…</p>
<p id="updated"></p>
</header>
<main id="pools"></main>
<script>${script}</script>
</body>
</html>
`;
