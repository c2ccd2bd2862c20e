// dedupe-proxy console: the admin API (/v1/*) as pages, with no framework and no build
// step. The token lives in this tab's sessionStorage and goes out as `Authorization`:
// the browser never sends a credential on its own, so no other site can act through it.
// Everything shown is set as text, never parsed as HTML.
'use strict';

const TOKEN_KEY = 'dedupe-proxy.token';
const DELIVERIES_SHOWN_MAX = 500;
const numbers = new Intl.NumberFormat();
let session = null; // GET /v1/overview's answer: the role, the outcomes, the routes
let stopPage = () => {}; // ends what the page on show left running (a live tail)
let generation = 0; // counts the pages asked for: a page built for an older one is dropped
let building = null; // where the page being built is shown, until it is put in place

// ---- building the page -------------------------------------------------------------

function h(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith('on')) node.addEventListener(name.slice(2), value);
    else if (name === 'class') node.className = value;
    else node.setAttribute(name, value === true ? '' : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    // Every text shown goes through visible(): recorded headers, bodies, paths and keys
    // are a sender's text. A <pre> keeps its line breaks and tabs.
    node.append(child instanceof Node ? child : visible(child, tag === 'pre'));
  }
  return node;
}

function count(n, noun) {
  return `${num(n)} ${n === 1 ? noun : noun + 's'}`;
}

function num(value) {
  return value === null || value === undefined ? '–' : numbers.format(value);
}

// A time in the browser's zone, UTC on hover.
function time(text) {
  if (!text) return h('span', { class: 'muted' }, '–');
  const at = new Date(text);
  if (Number.isNaN(at.getTime())) return text;
  return h('time', { datetime: at.toISOString(), title: at.toISOString().replace('.000Z', 'Z') + ' (UTC)' },
    at.toLocaleString());
}

function outcome(name) {
  return h('span', { class: 'outcome ' + String(name) }, String(name).replace(/_/g, ' '));
}

function fields(pairs) {
  return h('dl', { class: 'fields' }, pairs.filter(Boolean).map(([name, value]) =>
    [h('dt', {}, name), h('dd', {}, value === null || value === undefined || value === '' ? h('span', { class: 'muted' }, '–') : value)]));
}

function table(headings, rows, empty) {
  if (rows.length === 0) return h('p', { class: 'empty' }, empty);
  return h('div', { class: 'table-wrap' }, h('table', {},
    h('thead', {}, h('tr', {}, headings.map(([label, cls]) => h('th', { class: cls || null, scope: 'col' }, label)))),
    h('tbody', {}, rows)));
}

function main() {
  return document.getElementById('main');
}

function show(...nodes) {
  (building || main()).replaceChildren(h('div', { class: 'page' }, nodes));
}

// Control, direction and invisible format characters (a sender chooses keys, paths,
// headers and bodies) shown as escapes, so that text cannot reorder, hide or break what
// a sentence around it says; with `lines`, line breaks and tabs are kept. The same set as
// src/misleading.rs, whose test `the_consoles_set_is_this_one` holds the two together.
const MISLEADING = /[\u0000-\u001f\u007f-\u009f\u00ad\u034f\u061c\u115f\u1160\u180b-\u180f\u200b-\u200f\u2028-\u202e\u2060-\u206f\u2800\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff9-\ufffb\u{e0000}-\u{e007f}\u{e0100}-\u{e01ef}]/gu;
function visible(text, lines) {
  return String(text).replace(MISLEADING, (c) => (lines && (c === '\n' || c === '\t')
    ? c : `\\u{${c.codePointAt(0).toString(16)}}`));
}

function alertBox(message, info) {
  const box = document.getElementById('alert');
  box.textContent = visible(message || '');
  box.className = info ? 'info' : '';
  box.setAttribute('role', info ? 'status' : 'alert');
  box.hidden = !message;
}

function canChange() {
  return session && session.access.role === 'operator';
}

function link(hash, text) {
  return h('a', { href: hash }, text);
}

function enc(part) {
  return encodeURIComponent(part);
}

// ---- the API -----------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, body) {
    super(body && (body.detail || body.message) ? (body.detail || body.message) : `HTTP ${status}`);
    this.status = status;
    this.body = body || {};
  }
}

// A change says it is JSON even without a body: the port refuses a POST that a form on
// another site could have sent.
function headers(change) {
  const sent = { Accept: 'application/json' };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) sent.Authorization = 'Bearer ' + token;
  if (change) sent['Content-Type'] = 'application/json';
  return sent;
}

// The answer's JSON; `{}` for one without a body (a 204).
async function api(method, path, body) {
  const response = await fetch(path, {
    method, headers: headers(method !== 'GET'), cache: 'no-store', credentials: 'omit',
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  let parsed = {};
  try { parsed = text ? JSON.parse(text) : {}; } catch (_) { parsed = { detail: text }; }
  if (!response.ok) throw new ApiError(response.status, parsed);
  return parsed;
}

// A failed request's message in the page; a missing or wrong token asks for one.
function failed(error) {
  if (error instanceof ApiError && error.status === 401) {
    session = null;
    signIn(error.body.message);
    return;
  }
  alertBox(error instanceof ApiError
    ? `${error.body.error || 'error'} (${error.status}): ${error.message}`
    : `The admin port did not answer: ${error.message}`);
}

// ---- signing in --------------------------------------------------------------------

function signIn(reason) {
  stopPage();
  document.getElementById('who').replaceChildren();
  const input = h('input', { id: 'token', type: 'password', autocomplete: 'off', required: true });
  const form = h('form', { class: 'signin', onsubmit: (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    alertBox('');
    route();
  } },
  h('h1', {}, 'Sign in'),
  h('p', {}, 'This admin port asks for a token: the value of ', h('code', {}, 'admin.token_env'),
    ' (or of ', h('code', {}, 'admin.viewer_token_env'), ' to look without changing anything). It stays in this tab only.'),
  reason ? h('p', { class: 'muted' }, reason) : null,
  h('label', {}, 'Token', input),
  h('div', { class: 'actions' }, h('button', { class: 'primary', type: 'submit', id: 'sign-in' }, 'Sign in')));
  show(form);
  input.focus();
}

function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  session = null;
  signIn('Signed out.');
}

function showWho() {
  const who = document.getElementById('who');
  const access = session.access;
  const role = access.role === 'operator' ? 'operator' : 'viewer (read only)';
  const signedIn = sessionStorage.getItem(TOKEN_KEY);
  who.replaceChildren(h('span', {}, `${role} · ${access.credential}`,
    signedIn ? h('button', { type: 'button', onclick: signOut }, 'Sign out') : null));
}

// ---- confirming a change -----------------------------------------------------------

// Asks before a change. `subject` (a key, which a sender chose) is shown apart, as code,
// so that it cannot reword the question; `typed` must be typed to confirm (clearing a
// whole scope).
function confirmChange({ title, text, subject, typed }) {
  const dialog = document.getElementById('confirm');
  const input = document.getElementById('confirm-typed');
  const ok = document.getElementById('confirm-ok');
  const shown = document.getElementById('confirm-subject');
  document.getElementById('confirm-title').textContent = title;
  shown.textContent = visible(subject || '');
  shown.hidden = !subject;
  document.getElementById('confirm-text').textContent = visible(text);
  document.getElementById('confirm-typed-label').hidden = !typed;
  document.getElementById('confirm-expected').textContent = visible(typed || '');
  input.value = '';
  ok.disabled = Boolean(typed);
  input.oninput = () => { ok.disabled = input.value !== typed; };
  return new Promise((resolve) => {
    const finish = (answer) => { dialog.close(); resolve(answer); };
    ok.onclick = () => finish(true);
    document.getElementById('confirm-cancel').onclick = () => finish(false);
    input.onkeydown = (event) => { if (event.key === 'Enter' && !ok.disabled) finish(true); };
    dialog.oncancel = () => resolve(false);
    dialog.showModal();
    (typed ? input : ok).focus();
  });
}

// Runs a change and says what it changed: its answer, or null when it failed.
async function change(run, said) {
  try {
    const answer = await run();
    alertBox(said(answer), true);
    return answer;
  } catch (error) {
    failed(error);
    return null;
  }
}

// Asks first (`ask`: what `confirmChange` takes), then runs the change: its answer, or
// null when the operator declined or the change failed.
async function confirmedChange(ask, run, said) {
  if (!await confirmChange(ask)) return null;
  return change(run, said);
}

// ---- pages ---------------------------------------------------------------------------

async function overviewPage() {
  const o = session;
  const started = new Date(Date.now() - o.uptime_seconds * 1000);
  const reload = o.reload
    ? [o.reload.ok ? 'succeeded ' : 'failed ', time(o.reload.at), ` (${o.reload.detail})`]
    : 'none since the start';
  const store = o.store.healthy ? 'healthy' : `failing: ${o.store.error}`;
  const rows = o.routes.map((r) => {
    const n = r.requests;
    return h('tr', {},
      h('td', {}, link(`#/route/${enc(r.route)}`, r.route)),
      h('td', { class: 'hide-narrow' }, r.scope),
      h('td', { class: 'hide-narrow' }, r.delivery),
      h('td', { class: 'num' }, num(n.forwarded + n.queued)),
      h('td', { class: 'num' }, num(n.duplicate)),
      h('td', { class: 'num' }, num(n.rejected)),
      h('td', { class: 'num' }, num(n.unavailable)),
      h('td', { class: 'num hide-narrow' }, num(n.released)),
      h('td', { class: 'num hide-narrow' }, num(n['in-flight'])),
      h('td', { class: 'num' }, num(r.held_keys)),
      h('td', { class: 'num' }, r.queue ? num(r.queue.waiting + r.queue.retrying) : '–'),
      h('td', { class: 'num' }, r.queue ? num(r.queue.dead) : '–'));
  });
  show(h('h1', {}, 'Overview'),
    h('div', { class: 'cards' },
      card('Version', o.version),
      card('Up since', time(started.toISOString()), `${num(Math.round(o.uptime_seconds))} s`),
      card(`Store (${o.store.kind})`, store, [o.store.done_keys === null ? null : `${count(o.store.done_keys, 'done key')} · `,
        `${count(o.store.errors, 'error')} since the start`,
        o.store.outcomes_announced === false ? ' · waiters not told of outcomes: set direct_url' : null]),
      card('Claims in flight', num(o.claims_in_flight)),
      card('Last reload', reload),
      card('Delivery log', o.delivery_log ? 'on' : 'off: set delivery_log in the configuration to see deliveries')),
    chartsSection(null),
    h('h2', {}, 'Routes'),
    table([['Route'], ['Scope', 'hide-narrow'], ['Delivery', 'hide-narrow'], ['Forwarded', 'num'], ['Duplicates', 'num'],
      ['Refused', 'num'], ['Store unavailable', 'num'], ['Released', 'num hide-narrow'], ['Answered in flight', 'num hide-narrow'], ['Held keys', 'num'], ['Queued', 'num'], ['Dead', 'num']], rows,
    'No routes: every request goes to the default upstream. Add one under routes: in the configuration file, then reload.'),
    h('p', { class: 'muted' }, 'Requests counted since this replica started; held keys and queues as the store last said.'),
    ...replicaSection(o.replicas));
}

// Every replica sharing the store, as each last reported, and their totals; on sled, a
// line saying the page shows this process alone.
function replicaSection(list) {
  if (!list) return [h('p', { class: 'muted' }, 'This page shows this process: its sled store is not shared with other replicas.')];
  const row = (name, r, n) => h('tr', { class: r && r.silent ? 'silent' : null },
    h('td', {}, name),
    h('td', {}, r ? r.version : ''),
    h('td', { class: 'hide-narrow' }, r ? time(r.started_at) : ''),
    h('td', {}, r ? [time(r.last_seen), r.silent ? ' · silent' : ''] : ''),
    h('td', { class: 'num' }, num((n.forwarded || 0) + (n.queued || 0))),
    h('td', { class: 'num' }, num(n.duplicate || 0)),
    h('td', { class: 'num hide-narrow' }, num(n.rejected || 0)));
  const rows = list.replicas.map((r) => row(r.id === list.this ? `${r.id} (this one)` : r.id, r, r.requests));
  if (rows.length > 0) rows.push(row('All', null, list.totals));
  return [h('h2', {}, 'Replicas'),
    table([['Replica'], ['Version'], ['Started', 'hide-narrow'], ['Last seen'], ['Forwarded', 'num'], ['Duplicates', 'num'], ['Refused', 'num hide-narrow']], rows,
      'No replica has reported yet, or the store did not answer.'),
    h('p', { class: 'muted' }, 'Each replica reports every 5 s; one not heard from for 15 s is marked silent.')];
}

// ---- charts --------------------------------------------------------------------------

const SVG_NS = 'http://www.w3.org/2000/svg';
const CHART = { width: 600, height: 120, top: 4 };
const GROUPS = [['forwarded', 'forwarded'], ['duplicate', 'duplicates'], ['refused', 'refused'],
  ['released', 'released'], ['held', 'held'], ['queued', 'queued']];
const RANGE_WORDS = { hour: 'the last hour', day: 'the last day' };
// How often the charts are read again while on show: the hour's every 15 s, the day's
// (a larger read, of figures that change little) every minute.
const CHARTS_EVERY = { hour: 15000, day: 60000 };
// The most steps a chart draws: a day's minutes go five to a step, each step the busiest
// of its five (the captions stay per minute), so that a minute is never thinner than a
// pixel at a phone's width.
const CHART_STEPS = 300;

// An SVG element; its text, like the page's, is set as text.
function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value !== null && value !== undefined) node.setAttribute(name, String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : visible(child));
  }
  return node;
}

// The charts of the last hour (or day) of every route, or of `route`: drawn in place once
// loaded, and again every CHARTS_EVERY ms while on show; `data-range` on the section says
// which range is on show.
function chartsSection(route) {
  const body = h('div', { class: 'charts' });
  const section = h('section', { id: 'charts' });
  const buttons = Object.keys(RANGE_WORDS).map((range) => h('button', {
    type: 'button', id: `range-${range}`, 'aria-pressed': String(range === 'hour'), onclick: () => load(range),
  }, range === 'hour' ? 'Last hour' : 'Last day'));
  let asked = 0; // counts the reads: an answer to an older one (the range changed) is dropped
  let range = 'hour';
  const load = async (chosen) => {
    range = chosen;
    const mine = ++asked;
    for (const button of buttons) button.setAttribute('aria-pressed', String(button.id === `range-${range}`));
    const query = new URLSearchParams({ range });
    if (route) query.set('route', route);
    let drawn;
    try {
      drawn = drawCharts(await api('GET', '/v1/charts?' + query));
    } catch (error) {
      if (error instanceof ApiError && error.status === 401) return failed(error);
      drawn = [h('p', { class: 'empty' }, `The charts could not be loaded: ${error.message}`)];
    }
    if (mine !== asked) return;
    body.replaceChildren(...drawn);
    section.dataset.range = range;
  };
  const again = async () => {
    await new Promise((resolve) => setTimeout(resolve, CHARTS_EVERY[range]));
    // Dropped with its page: a page left for another stops here.
    if (!section.isConnected) return;
    await load(range);
    again();
  };
  load('hour').then(again);
  section.append(h('div', { class: 'chart-head' }, h('h2', {}, 'Per minute'), h('div', { class: 'actions' }, buttons)), body);
  return section;
}

function drawCharts(c) {
  const words = RANGE_WORDS[c.range];
  const minutes = c.minutes;
  const parts = [];
  if (c.store_error) {
    parts.push(h('p', { class: 'warning', role: 'status' }, `The store did not give the figures (${c.store_error}): these charts show this replica's own minutes only.`));
  }
  parts.push(h('div', { class: 'chart-grid' }, deliveryChart(minutes, words), latencyChart(minutes, words),
    c.queued ? queueCharts(minutes, words) : null));
  const per = Math.ceil(minutes.length / CHART_STEPS);
  // On sled each start of the process is a replica of its own to the store.
  const shared = session.replicas !== null;
  const running = shared
    ? "the minute running is this replica's so far; the others' appear as each of their minutes ends."
    : "the minute running is this run's so far.";
  parts.push(h('p', { class: 'muted' }, c.replicas.length > 1
    ? `Figures of ${count(c.replicas.length, shared ? 'replica' : 'run')} of this proxy, added up; ${running}`
    : `Figures of this ${shared ? 'replica' : 'run'}; ${running}`,
  per > 1 ? ` Each step shows the busiest of its ${per} minutes.` : ''));
  return parts;
}

// Deliveries per minute, stacked by what became of them.
function deliveryChart(minutes, words) {
  const totals = Object.fromEntries(GROUPS.map(([key]) => [key, minutes.reduce((sum, m) => sum + m.deliveries[key], 0)]));
  const perMinute = minutes.map((m) => sumOf(m.deliveries));
  const all = perMinute.reduce((a, b) => a + b, 0);
  const top = Math.max(...perMinute);
  const busiest = minutes[perMinute.indexOf(top)];
  const summary = all === 0 ? `No deliveries in ${words}.`
    : `Deliveries per minute in ${words}: ${GROUPS.map(([key, noun]) => `${noun} ${num(totals[key])}`).join(', ')}. The busiest minute, ${clock(busiest.at)}, had ${num(top)}.`;
  const shown = steps(minutes).map((step) => step.reduce((busiest, m) =>
    (sumOf(m.deliveries) > sumOf(busiest.deliveries) ? m : busiest)));
  const plot = frame(minutes, shown.length, top, '/min');
  const below = new Array(shown.length).fill(0);
  for (const [key] of GROUPS) {
    if (totals[key] === 0) continue;
    const above = shown.map((m, i) => below[i] + m.deliveries[key]);
    plot.scale.append(svg('path', { class: `g-${key}`, d: stackedArea(below, above, plot) }));
    above.forEach((value, i) => { below[i] = value; });
  }
  if (all === 0) plot.node.append(h('p', { class: 'chart-empty' }, `No deliveries in ${words}`));
  const legend = h('ul', { class: 'legend' }, GROUPS.map(([key, noun]) =>
    h('li', {}, h('span', { class: `swatch g-${key}`, 'aria-hidden': 'true' }), `${noun} ${num(totals[key])}`)));
  return figure('chart-deliveries', 'Deliveries', summary, plot.node, legend);
}

// The app's latency per minute: the median and the 99th percentile.
function latencyChart(minutes, words) {
  const answers = minutes.reduce((sum, m) => sum + m.answers, 0);
  const p99s = minutes.map((m) => m.p99_ms).filter((v) => v !== null);
  const top = Math.max(0, ...p99s);
  const worst = minutes.find((m) => m.p99_ms === top);
  const p50s = minutes.map((m) => m.p50_ms).filter((v) => v !== null);
  const summary = answers === 0 ? `No answers from the app in ${words}.`
    : `The app's latency in ${words}, over ${count(answers, 'answer')}: the median from ${ms(Math.min(...p50s))} to ${ms(Math.max(...p50s))} per minute; the 99th percentile at most ${ms(top)}, at ${clock(worst.at)}.`;
  const p50 = largest(minutes, (m) => m.p50_ms);
  const plot = frame(minutes, p50.length, top, ' ms');
  plot.scale.append(svg('path', { class: 'line p50', d: line(p50, plot) }),
    svg('path', { class: 'line p99', d: line(largest(minutes, (m) => m.p99_ms), plot) }));
  if (answers === 0) plot.node.append(h('p', { class: 'chart-empty' }, `No answers from the app in ${words}`));
  const legend = h('ul', { class: 'legend' }, h('li', {}, h('span', { class: 'swatch p50', 'aria-hidden': 'true' }), 'median (p50)'),
    h('li', {}, h('span', { class: 'swatch p99', 'aria-hidden': 'true' }), '99th percentile'));
  return figure('chart-latency', "The app's latency", summary, plot.node, legend);
}

// Queued routes: jobs not delivered yet, and the oldest one's age.
function queueCharts(minutes, words) {
  const series = (pick, unit, title, id, noun) => {
    const values = minutes.map(pick);
    const top = Math.max(0, ...values.filter((v) => v !== null));
    const now = values[values.length - 1];
    const summary = `${title} in ${words}: ${unit(now ?? 0)} now, at most ${unit(top)}${top > 0 ? `, at ${clock(minutes[values.indexOf(top)].at)}` : ''}.`;
    const drawn = largest(minutes, pick);
    const plot = frame(minutes, drawn.length, top, noun);
    plot.scale.append(svg('path', { class: 'line queue', d: line(drawn, plot) }));
    return figure(id, title, summary, plot.node, null);
  };
  return h('div', { class: 'chart-pair' },
    series((m) => m.queue_waiting, (v) => num(v), 'Jobs waiting', 'chart-waiting', ''),
    series((m) => m.queue_oldest_seconds, (v) => `${num(Math.round(v))} s`, "The oldest job's age", 'chart-oldest', ' s'));
}

function figure(id, title, summary, drawing, legend) {
  const caption = `${id}-caption`;
  drawing.setAttribute('aria-labelledby', caption);
  return h('figure', { class: 'chart', id }, h('h3', {}, title), drawing, legend,
    h('figcaption', { id: caption }, summary));
}

// The drawing's frame: the shapes in an SVG stretched to the width, the top value and
// the range's ends as text beside it (text in a stretched SVG would stretch too); `scale`
// maps a minute's index and a value into it.
function frame(minutes, count, top, unit) {
  const { width, height, top: over } = CHART;
  const ceiling = top > 0 ? niceCeiling(top) : 1;
  const x = (i) => (i / count) * width;
  const y = (value) => height - (value / ceiling) * (height - over);
  const scale = svg('g', {});
  const drawing = svg('svg', { viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: 'none', 'aria-hidden': 'true' },
    svg('line', { x1: 0, y1: y(ceiling), x2: width, y2: y(ceiling), class: 'grid' }),
    svg('line', { x1: 0, y1: height, x2: width, y2: height, class: 'axis' }),
    scale);
  const node = h('div', { class: 'plot', role: 'img' },
    h('span', { class: 'tick top' }, `${num(ceiling)}${unit}`), drawing,
    h('div', { class: 'ticks' }, h('span', {}, clock(minutes[0].at)), h('span', {}, 'now')));
  return { node, scale, x, y };
}

// The minutes in steps of CHART_STEPS at most.
function steps(minutes) {
  const per = Math.ceil(minutes.length / CHART_STEPS);
  const all = [];
  for (let i = 0; i < minutes.length; i += per) all.push(minutes.slice(i, i + per));
  return all;
}

// Each step's largest value of `pick`, null where no minute of it has one.
function largest(minutes, pick) {
  return steps(minutes).map((step) => step.map(pick).reduce((most, value) =>
    (value !== null && (most === null || value > most) ? value : most), null));
}

function sumOf(deliveries) {
  return GROUPS.reduce((sum, [key]) => sum + deliveries[key], 0);
}

// 1, 2 or 5 times a power of ten, at or above `value`.
function niceCeiling(value) {
  const power = 10 ** Math.floor(Math.log10(value));
  return [1, 2, 5, 10].map((step) => step * power).find((step) => step >= value);
}

// The area between `below` and `above`, each minute a step.
function stackedArea(below, above, plot) {
  const points = [];
  above.forEach((value, i) => points.push([plot.x(i), plot.y(value)], [plot.x(i + 1), plot.y(value)]));
  for (let i = below.length - 1; i >= 0; i -= 1) points.push([plot.x(i + 1), plot.y(below[i])], [plot.x(i), plot.y(below[i])]);
  return 'M' + points.map(([px, py]) => `${px.toFixed(1)},${py.toFixed(1)}`).join('L') + 'Z';
}

// A line in steps, each minute's value across its minute (one minute alone shows too),
// broken where a minute has none.
function line(values, plot) {
  let d = '';
  let drawing = false;
  values.forEach((value, i) => {
    if (value === null) { drawing = false; return; }
    const y = plot.y(value).toFixed(1);
    d += `${drawing ? 'L' : 'M'}${plot.x(i).toFixed(1)},${y}L${plot.x(i + 1).toFixed(1)},${y}`;
    drawing = true;
  });
  return d || 'M0,0';
}

function clock(text) {
  return new Date(text).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' });
}

function ms(value) {
  return value >= 100 ? `${num(Math.round(value))} ms` : `${num(Math.round(value * 10) / 10)} ms`;
}

function card(label, value, sub) {
  return h('div', { class: 'card' }, h('div', { class: 'label' }, label), h('div', { class: 'value' }, value),
    sub ? h('div', { class: 'muted' }, sub) : null);
}

const DELIVERY_FILTERS = ['route', 'outcome', 'status', 'key', 'key_prefix', 'since', 'until'];

function deliveryRow(entry, fresh) {
  return h('tr', { class: fresh ? 'fresh' : null, 'data-id': entry.id },
    h('td', {}, time(entry.at)),
    h('td', {}, entry.route || h('span', { class: 'muted' }, 'none')),
    h('td', { class: 'key' }, link(`#/delivery/${enc(entry.id)}`, entry.key || '(no key)')),
    h('td', {}, outcome(entry.outcome)),
    h('td', { class: 'num' }, entry.status === null ? '–' : entry.status),
    h('td', { class: 'num hide-narrow' }, entry.upstream_ms === null ? '–' : `${num(entry.upstream_ms)} ms`),
    h('td', { class: 'hide-narrow' }, entry.client || ''));
}

async function deliveriesPage(params) {
  const filter = new URLSearchParams();
  for (const name of DELIVERY_FILTERS) if (params.get(name)) filter.set(name, params.get(name));
  const form = deliveryFilters(params);
  const tbody = h('tbody', {});
  const more = h('button', { type: 'button', hidden: true }, 'Older entries');
  const status = h('p', { class: 'muted', 'aria-live': 'polite' });
  const live = h('input', { type: 'checkbox', id: 'live', checked: !params.get('until') });
  show(h('h1', {}, 'Deliveries'), form,
    h('div', { class: 'actions' }, h('label', { class: 'inline' }, live, 'Live: show new entries as they come'), status),
    h('div', { class: 'table-wrap' }, h('table', { id: 'deliveries' },
      h('thead', {}, h('tr', {}, ['Time', 'Route', 'Key', 'Outcome', 'Status', 'Upstream', 'Client'].map((label, i) =>
        h('th', { scope: 'col', class: i >= 5 ? 'hide-narrow' : null }, label)))),
      tbody)),
    h('div', { class: 'actions' }, more));
  let cursor = null;
  const load = async () => {
    const query = new URLSearchParams(filter);
    query.set('limit', '100');
    if (cursor) query.set('cursor', cursor);
    try {
      const page = await api('GET', '/v1/deliveries?' + query);
      tbody.append(...page.deliveries.map((entry) => deliveryRow(entry, false)));
      cursor = page.next;
      more.hidden = !cursor;
      status.textContent = tbody.children.length === 0
        ? (cursor ? 'None in the newest entries read; look at older ones.' : 'No entries match. Send a request through the proxy, or widen the filter.')
        : `${num(tbody.children.length)} shown`;
    } catch (error) { failed(error); }
  };
  more.onclick = load;
  await load();
  const tail = new Tail(filter, (entry) => {
    tbody.prepend(deliveryRow(entry, true));
    while (tbody.children.length > DELIVERIES_SHOWN_MAX) tbody.lastElementChild.remove();
    status.textContent = `${num(tbody.children.length)} shown`;
  });
  live.onchange = () => (live.checked ? tail.start() : tail.stop());
  // Started once the page is in place (a page dropped for a newer one starts nothing).
  return () => {
    if (live.checked) tail.start();
    return () => tail.stop();
  };
}

function deliveryFilters(params) {
  const outcomes = h('select', { name: 'outcome' }, h('option', { value: '' }, 'any'),
    session.outcomes.map((name) => h('option', { value: name, selected: params.get('outcome') === name }, name.replace(/_/g, ' '))));
  const routes = h('select', { name: 'route' }, h('option', { value: '' }, 'any'),
    session.routes.map((r) => h('option', { value: r.route, selected: params.get('route') === r.route }, r.route)));
  const input = (name, placeholder) => h('input', { name, placeholder, value: params.get(name) || '', size: 14 });
  const localTime = (name) => h('input', { name, type: 'datetime-local', step: 1, value: toLocalInput(params.get(name)) });
  return h('form', { class: 'filters', onsubmit: (event) => {
    event.preventDefault();
    const chosen = new URLSearchParams();
    for (const [name, value] of new FormData(event.target)) {
      if (!value) continue;
      chosen.set(name, name === 'since' || name === 'until' ? new Date(value).toISOString() : value);
    }
    location.hash = '#/deliveries?' + chosen;
  } },
  h('label', {}, 'Route', routes), h('label', {}, 'Outcome', outcomes),
  h('label', {}, 'Status', input('status', '502 or 5xx')), h('label', {}, 'Key', input('key', 'exact')),
  h('label', {}, 'Key prefix', input('key_prefix', 'evt_')),
  h('label', {}, 'Since', localTime('since')), h('label', {}, 'Until', localTime('until')),
  h('button', { type: 'submit', class: 'primary' }, 'Filter'),
  h('a', { href: '#/deliveries' }, 'Clear filters'));
}

function toLocalInput(text) {
  if (!text) return '';
  const at = new Date(text);
  if (Number.isNaN(at.getTime())) return '';
  return new Date(at.getTime() - at.getTimezoneOffset() * 60000).toISOString().slice(0, 19);
}

// The delivery log's tail (Server-Sent Events) read with fetch, which can send the token
// (EventSource cannot).
class Tail {
  constructor(filter, onEntry) {
    this.filter = filter;
    this.onEntry = onEntry;
    this.controller = null;
  }

  start() {
    if (this.controller) return;
    const controller = new AbortController();
    this.controller = controller;
    // Only this read's own end clears it: a newer start may have taken its place.
    const ended = () => { if (this.controller === controller) this.controller = null; };
    this.renew = false;
    this.read(controller.signal).then(() => {
      const current = this.controller === controller;
      ended();
      // A tail ends at its lifetime saying so: another takes its place at once.
      if (current && this.renew) this.start();
      else if (current) alertBox('The live view ended: reload the page to start it again.');
    }, (error) => {
      if (error.name !== 'AbortError') failed(error);
      ended();
    });
  }

  stop() {
    if (this.controller) this.controller.abort();
    this.controller = null;
  }

  async read(signal) {
    const response = await fetch('/v1/deliveries/tail?' + this.filter, {
      headers: headers(false), cache: 'no-store', credentials: 'omit', signal,
    });
    if (!response.ok) throw new ApiError(response.status, await response.json().catch(() => null));
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffered = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffered += value;
      let end;
      while ((end = buffered.indexOf('\n\n')) >= 0) {
        this.event(buffered.slice(0, end));
        buffered = buffered.slice(end + 2);
      }
    }
  }

  event(text) {
    let name = 'message';
    const data = [];
    for (const line of text.split('\n')) {
      if (line.startsWith('event:')) name = line.slice(6).trim();
      else if (line.startsWith('data:')) data.push(line.slice(5).trimStart());
    }
    if (name === 'delivery') this.onEntry(JSON.parse(data.join('\n')));
    else if (name === 'end') this.renew = true;
    else if (name === 'lagged') alertBox(`The live view fell behind and missed ${JSON.parse(data.join('\n')).missed} entries; reload the page to see them.`);
  }
}

const WHY = {
  forwarded: 'First delivery of this key: forwarded, the app succeeded, the key is done.',
  duplicate: 'The key was already done: answered at once, not forwarded.',
  in_flight: 'Another delivery of this key was being forwarded: answered so that the sender retries.',
  held: 'The key is held: a forward may have run. Nothing runs it again until an operator resolves it.',
  stale: 'Older than a version already done for its entity: not forwarded.',
  queued: 'Stored for queued delivery and acknowledged; the proxy delivers it.',
  upstream_error: 'Forwarded; the app failed or could not be reached, so the claim was released for a retry.',
  store_error: 'The store could not be used; nothing was forwarded.',
  unkeyed: 'Forwarded without a claim (no key, or the store failing with on_store_error: forward).',
  signature_refused: 'Refused: the signature was missing, malformed, stale or wrong.',
  bad_request: 'Refused before anything was stored.',
  unmatched: 'No route took it.',
  delivered: 'A queued attempt the app accepted.',
  retrying: 'A queued attempt that failed; tried again later.',
  dead: 'A queued attempt after which the job went to dead letters.',
  changed: 'An operator changed this key through the admin API.',
};

async function deliveryPage(id) {
  const entry = await api('GET', `/v1/deliveries/${enc(id)}`);
  const keyState = h('div', {}, h('p', { class: 'muted' }, 'Reading the key…'));
  show(h('h1', {}, 'Delivery ', h('code', {}, entry.id)),
    h('h2', {}, 'What was decided, and why'),
    h('p', {}, outcome(entry.outcome), ' ', WHY[entry.outcome] || '',
      entry.refusal ? [' Refusal: ', h('code', {}, entry.refusal), '.'] : '',
      entry.waited ? ' It waited for an earlier delivery of the key.' : '',
      entry.replayed ? ' The recorded answer was replayed.' : ''),
    fields([
      ['Time', time(entry.at)], ['Route', entry.route], ['Scope', entry.scope],
      ['Key', entry.key ? h('code', {}, entry.key) : null],
      ['Answer to the sender', entry.status], ['Upstream status', entry.upstream_status],
      ['Upstream latency', entry.upstream_ms === null ? null : `${num(entry.upstream_ms)} ms`],
      ['Time in the proxy', entry.duration_ms === null ? null : `${num(entry.duration_ms)} ms`],
      ['Request', `${entry.method || ''} ${entry.path || ''}`], ['Size', `${num(entry.size)} bytes`],
      ['Request id', entry.request_id], ['Trace id', entry.trace_id ? h('code', {}, entry.trace_id) : null],
      ['Client', entry.client], ['Replica', entry.replica], ['By', entry.by],
      entry.attempt ? ['Attempt', entry.attempt] : null,
    ]),
    entry.headers && entry.headers.length
      ? [h('h2', {}, 'Recorded headers'), table([['Name'], ['Value']], entry.headers.map(([name, value]) =>
        h('tr', {}, h('td', {}, name), h('td', { class: 'key' }, value))), '')]
      : h('p', { class: 'muted' }, 'Headers are not recorded for this route (delivery_log headers).'),
    entry.body !== undefined && entry.body !== null
      ? [h('h2', {}, `Recorded body${entry.body_truncated ? ' (truncated)' : ''}${entry.body_encoding === 'base64' ? ' (base64)' : ''}`), h('pre', {}, entry.body)]
      : null,
    h('h2', {}, 'The key now'), keyState);
  if (!entry.route || !entry.key) {
    keyState.replaceChildren(h('p', { class: 'muted' }, 'This entry has no key.'));
    return;
  }
  keyState.replaceChildren(await keyView(entry.route, entry.key));
}

// A route of `scope`, through which the API reaches the scope's keys.
function routeOfScope(scope) {
  const found = session.routes.find((r) => r.scope === scope);
  return found ? found.route : null;
}

async function keysPage(params) {
  const route = params.get('route');
  if (!route) return scopesPage();
  const prefix = params.get('prefix') || '';
  const state = params.get('state') || '';
  const scope = (session.routes.find((r) => r.route === route) || {}).scope || route;
  const query = new URLSearchParams({ route, limit: '100' });
  if (prefix) query.set('prefix', prefix);
  if (state) query.set('state', state);
  if (params.get('after')) query.set('after', params.get('after'));
  const page = await api('GET', '/v1/keys?' + query);
  const rows = page.keys.map((k) => h('tr', {},
    h('td', { class: 'key' }, link(`#/key/${enc(route)}/${enc(k.key)}`, k.key)),
    h('td', {}, outcome(k.state)),
    h('td', {}, time(k.claimed_at)),
    h('td', { class: 'hide-narrow' }, time(k.expires_at)),
    h('td', { class: 'num' }, k.answer_status || k.upstream_status || '–')));
  const next = new URLSearchParams(params);
  if (page.next) next.set('after', page.next);
  const form = h('form', { class: 'filters', onsubmit: (event) => {
    event.preventDefault();
    const chosen = new URLSearchParams({ route });
    for (const [name, value] of new FormData(event.target)) if (value) chosen.set(name, value);
    location.hash = '#/keys?' + chosen;
  } },
  h('label', {}, 'Prefix', h('input', { name: 'prefix', value: prefix, placeholder: 'evt_' })),
  h('label', {}, 'State', h('select', { name: 'state' }, ['', 'in_flight', 'done', 'held'].map((s) =>
    h('option', { value: s, selected: s === state }, s ? s.replace('_', ' ') : 'any')))),
  h('button', { type: 'submit', class: 'primary' }, 'Show'));
  const result = h('div', {});
  show(h('h1', {}, 'Keys of ', h('code', {}, scope)),
    h('p', {}, link('#/keys', 'All scopes'), ` · routes: ${session.routes.filter((r) => r.scope === scope).map((r) => r.route).join(', ')}`),
    form, result,
    canChange() ? h('div', { class: 'actions' },
      prefix ? h('button', { type: 'button', class: 'danger', id: 'forget-prefix', onclick: () => clearKeys(scope, prefix, result) },
        `Forget the done keys starting with “${prefix}”`) : null,
      h('button', { type: 'button', class: 'danger', id: 'clear-scope', onclick: () => clearKeys(scope, '', result) }, `Clear scope ${scope}`)) : null,
    table([['Key'], ['State'], ['Claimed'], ['Expires', 'hide-narrow'], ['Answer', 'num']], rows,
      page.next ? 'None on this page (a page may hold fewer than asked): look at the next one.'
        : prefix || state ? 'No live keys match. Try another prefix or state.' : 'No live keys in this scope yet: they appear as deliveries are claimed.'),
    page.next ? h('div', { class: 'actions' }, link('#/keys?' + next, 'Next page')) : null);
}

async function clearKeys(scope, prefix, result) {
  const confirmed = prefix
    ? await confirmChange({ title: 'Forget keys by prefix', subject: prefix, typed: prefix,
      text: `Forget every done key of scope ${scope} starting with this prefix? Their next deliveries run the work again. Held and in-flight keys are left.` })
    : await confirmChange({ title: 'Clear a scope', typed: scope,
      text: `Forget every done key of scope ${scope}? Their next deliveries run the work again. Held and in-flight keys are left; other scopes are not touched.` });
  if (!confirmed) return;
  const asked = prefix ? { prefix } : {};
  let removed = 0;
  let answer;
  do {
    answer = await change(() => api('POST', `/v1/scopes/${enc(scope)}/clear`, asked),
      (a) => `Cleared ${count(removed + a.removed, 'key')}${a.complete ? '' : ' so far…'}`);
    if (!answer) return;
    removed += answer.removed;
    asked.after = answer.next;
  } while (!answer.complete && answer.next);
  result.replaceChildren(h('p', { class: 'result', id: 'change-result' },
    `Removed ${count(removed, 'key')}; ${num(answer.held_left)} held and ${num(answer.in_flight_left)} in flight left.`,
    answer.complete ? '' : ' Not complete: ask again.'));
}

async function scopesPage() {
  const { scopes } = await api('GET', '/v1/scopes');
  const rows = scopes.map((s) => {
    const route = routeOfScope(s.scope) || s.routes[0];
    const more = s.counted_all ? '' : '+';
    return h('tr', {},
      h('td', {}, link(`#/keys?route=${enc(route)}`, s.scope)),
      h('td', { class: 'hide-narrow' }, s.routes.join(', ')),
      h('td', { class: 'num' }, num(s.keys.in_flight) + more),
      h('td', { class: 'num' }, num(s.keys.done) + more),
      h('td', { class: 'num' }, num(s.keys.held) + more));
  });
  show(h('h1', {}, 'Keys'),
    h('p', { class: 'muted' }, 'Each scope is a route\'s keys, or those of the routes sharing a scope. Pick one to browse its keys.'),
    table([['Scope'], ['Routes', 'hide-narrow'], ['In flight', 'num'], ['Done', 'num'], ['Held', 'num']], rows,
      'No scopes: add a route to the configuration file.'));
}

// A key's record, with what an operator may do to it.
async function keyView(route, key) {
  let k;
  try {
    k = await api('GET', `/v1/keys/${enc(route)}/${enc(key)}`);
  } catch (error) {
    if (error instanceof ApiError && error.status === 404) {
      return h('p', { class: 'empty', id: 'key-state' }, 'Absent: not claimed, forgotten or expired. Its next delivery is forwarded.');
    }
    throw error;
  }
  const box = h('div', {});
  const again = async () => box.replaceWith(await keyView(route, key));
  const path = `/v1/keys/${enc(route)}/${enc(key)}`;
  const actions = [];
  if (canChange() && k.state === 'done') {
    const expiry = h('input', { id: 'expires-in', placeholder: '48h', size: 8 });
    actions.push(h('label', { class: 'inline' }, 'Expire in', expiry),
      h('button', { type: 'button', id: 'set-expiry', onclick: async () => {
        const after = expiry.value.trim();
        const ask = { title: 'Set the expiry', subject: key, text: `Expire this key ${after} from now? Once it expires, its next delivery runs the work again.` };
        if (await confirmedChange(ask, () => api('PATCH', path, { expires_in: after }), (a) => `Expiry of ${key} moved to ${a.expires_at}.`)) await again().catch(failed);
      } }, 'Set expiry'),
      h('button', { type: 'button', class: 'danger', id: 'forget', onclick: async () => {
        const ask = { title: 'Forget this key', subject: key, text: 'Its next delivery runs the work again.' };
        if (await confirmedChange(ask, () => api('DELETE', path), () => `Forgot ${key}: its next delivery is forwarded.`)) await again().catch(failed);
      } }, 'Forget'));
  }
  if (canChange() && k.state === 'held') {
    for (const [outcomeName, label, text] of [['done', 'Resolve: it ran', 'later deliveries get the duplicate answer'], ['release', 'Resolve: run it again', 'the next delivery runs the work']]) {
      actions.push(h('button', { type: 'button', id: `resolve-${outcomeName}`, onclick: async () => {
        const ask = { title: 'Resolve a held key', subject: key, text: `Resolve it as ${outcomeName}: ${text}?` };
        const run = () => api('POST', `${path}/resolve`, { outcome: outcomeName, held_at: k.held_at });
        if (await confirmedChange(ask, run, () => `Resolved ${key} as ${outcomeName}.`)) await again().catch(failed);
      } }, label));
    }
  }
  box.append(fields([
    ['State', h('span', { id: 'key-state' }, outcome(k.state))], ['Route', k.route], ['Key', h('code', {}, k.key)],
    ['Claimed', time(k.claimed_at)], ['Completed', time(k.completed_at)], ['Expires', time(k.expires_at)],
    ['Upstream status', k.upstream_status],
    k.done_because ? ['Done because', k.done_because] : null,
    k.held_because ? ['Held because', k.held_because] : null,
    k.held_at ? ['Held at', time(k.held_at)] : null,
    k.answer ? ['Recorded answer', `${k.answer.status}, ${num(k.answer.body_bytes)} bytes, ${k.answer.headers.length} headers`] : null,
    ['Body digest', k.body_sha256 ? h('code', {}, k.body_sha256) : null],
  ]), actions.length ? h('div', { class: 'actions' }, actions) : null,
  h('p', {}, link(`#/deliveries?route=${enc(route)}&key=${enc(key)}`, 'Deliveries of this key')));
  return box;
}

async function keyPage(route, key) {
  show(h('h1', {}, 'Key ', h('code', {}, key)), h('p', {}, link(`#/keys?route=${enc(route)}`, `Keys of ${route}`)),
    await keyView(route, key));
}

async function heldPage() {
  const scopes = [...new Set(session.routes.map((r) => r.scope))];
  const sections = [h('h1', {}, 'Held keys and dead letters')];
  const held = [];
  for (const scope of scopes) {
    const route = routeOfScope(scope);
    // A page may hold fewer than asked and still have a next one: follow it, a few times.
    let after = null;
    for (let pages = 0; pages < 10; pages += 1) {
      const query = new URLSearchParams({ route, state: 'held', limit: '100' });
      if (after) query.set('after', after);
      const page = await api('GET', `/v1/keys?${query}`);
      for (const k of page.keys) held.push({ scope, route, key: k });
      after = page.next;
      if (!after) break;
    }
  }
  const rows = held.map(({ scope, route, key: k }) => h('tr', {}, h('td', {}, scope),
    h('td', { class: 'key' }, link(`#/key/${enc(route)}/${enc(k.key)}`, k.key)),
    h('td', {}, time(k.held_at)), h('td', {}, k.held_because || '')));
  const progress = h('p', { 'aria-live': 'polite', id: 'held-progress' });
  const resolveAll = (outcomeName) => async () => {
    const what = outcomeName === 'done' ? 'done: later deliveries get the duplicate answer' : 'released: their next deliveries run the work';
    if (!await confirmChange({ title: 'Resolve every held key shown', text: `Resolve ${count(held.length, 'held key')} as ${what}?` })) return;
    let resolved = 0;
    for (const { route, key: k } of held) {
      const path = `/v1/keys/${enc(route)}/${enc(k.key)}/resolve`;
      try {
        await api('POST', path, { outcome: outcomeName, held_at: k.held_at });
      } catch (error) {
        failed(error);
        progress.textContent = visible(`Stopped at ${num(resolved)} of ${num(held.length)}: ${k.key} was not resolved.`);
        return;
      }
      resolved += 1;
      progress.textContent = `Resolved ${num(resolved)} of ${num(held.length)}`;
    }
    alertBox(`Resolved ${count(resolved, 'held key')} as ${outcomeName}.`, true);
  };
  sections.push(h('h2', {}, 'Held keys'),
    h('p', { class: 'muted' }, 'A held key\'s forward may have run: resolve it as done (it ran) or release it (run it again). Open one to see it first.'),
    canChange() && held.length ? h('div', { class: 'actions' },
      h('button', { type: 'button', id: 'resolve-all-done', onclick: resolveAll('done') }, 'Resolve all shown: they ran'),
      h('button', { type: 'button', id: 'resolve-all-release', onclick: resolveAll('release') }, 'Resolve all shown: run them again')) : null,
    progress,
    table([['Scope'], ['Key'], ['Held at'], ['Because']], rows, 'No held keys: nothing waits for a decision.'));
  const queue = await api('GET', '/v1/queue');
  sections.push(h('h2', {}, 'Dead letters'));
  if (queue.routes.length === 0) {
    sections.push(h('p', { class: 'empty' }, 'No queued routes: dead letters exist only where a route has delivery: queued.'));
  }
  for (const q of queue.routes) sections.push(await deadLetters(q));
  show(sections);
}

async function deadLetters(q) {
  const filter = h('input', { placeholder: 'evt_', size: 12, id: `dead-prefix-${q.route}` });
  const progress = h('p', { 'aria-live': 'polite', id: `replay-progress-${q.route}` });
  const tbody = h('tbody', { id: `dead-${q.route}` });
  const list = async () => {
    const query = new URLSearchParams({ limit: '100' });
    if (filter.value) query.set('key_prefix', filter.value);
    const page = await api('GET', `/v1/queue/${enc(q.route)}/dead?${query}`);
    tbody.replaceChildren(...page.jobs.map((job) => h('tr', {},
      h('td', { class: 'key' }, job.key), h('td', {}, time(job.dead_at)), h('td', {}, job.dead_because || ''),
      h('td', { class: 'num' }, job.last_status === null ? '–' : job.last_status),
      h('td', {}, canChange() ? h('button', { type: 'button', class: 'replay-one', 'aria-label': `Replay ${job.key}`, onclick: async () => {
        const ask = { title: 'Replay a dead letter', subject: job.key, text: 'The proxy delivers it to the app again.' };
        const run = () => api('POST', `/v1/queue/${enc(q.route)}/jobs/${enc(job.key)}/replay`);
        if (await confirmedChange(ask, run, () => `Replaying ${job.key}.`)) await list().catch(failed);
      } }, 'Replay') : ''))));
    const none = page.next ? 'None among the first read: the store holds more; narrow the prefix.' : 'No dead letters match.';
    if (!page.jobs.length) tbody.append(h('tr', {}, h('td', { colspan: 5, class: 'muted' }, none)));
  };
  const all = canChange() ? h('button', { type: 'button', class: 'primary', id: `replay-all-${q.route}`, onclick: async () => {
    const picked = filter.value ? `starting with “${filter.value}”` : '';
    const ask = { title: 'Replay dead letters', text: `Replay every dead letter of ${q.route} ${picked}?` };
    const query = filter.value ? `?key_prefix=${enc(filter.value)}` : '';
    const started = await confirmedChange(ask, () => api('POST', `/v1/queue/${enc(q.route)}/replays${query}`), (a) => `Replay ${a.id} started.`);
    if (started && await followReplay(started.id, progress)) await list().catch(failed);
  } }, 'Replay all that match') : null;
  await list();
  return h('section', {}, h('h2', {}, q.route, ` · ${num(q.dead)} dead`),
    h('div', { class: 'actions' }, h('label', { class: 'inline' }, 'Key prefix', filter),
      h('button', { type: 'button', id: `dead-show-${q.route}`, onclick: () => list().catch(failed) }, 'Show'), all),
    progress,
    h('div', { class: 'table-wrap' }, h('table', {},
      h('thead', {}, h('tr', {}, ['Key', 'Died', 'Because', 'Last status', ''].map((label) => h('th', { scope: 'col' }, label)))),
      tbody)));
}

// Shows a replay's progress until it ends (true) or the page is left (false).
async function followReplay(id, progress) {
  while (progress.isConnected) {
    const replay = await api('GET', `/v1/replays/${enc(id)}`).catch(failed);
    if (!replay) return false;
    progress.textContent = `Replay ${id}: ${replay.state}, ${num(replay.replayed)} of ${num(replay.matched)} replayed`;
    if (replay.state !== 'running') return true;
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
  return false;
}

async function routesPage() {
  const routes = await api('GET', '/v1/routes');
  show(h('h1', {}, 'Routes'),
    h('p', {}, 'Default upstream: ', h('code', {}, routes.upstream), ' · unmatched requests: ', h('code', {}, JSON.stringify(routes.unmatched))),
    canChange() ? h('div', { class: 'actions' }, h('button', { type: 'button', class: 'primary', id: 'reload', onclick: async () => {
      const said = (a) => `Reloaded: ${count(a.routes, 'route')}${a.restart_needed.length ? `; needs a restart: ${a.restart_needed.join(', ')}` : ''}.`;
      const answer = await change(() => api('POST', '/v1/reload'), said);
      if (!answer) return;
      // The page again, with the routes now running, and what the reload did.
      await loadSession().catch(failed);
      await route();
      alertBox(said(answer), true);
    } }, 'Reload the configuration file')) : null,
    routes.routes.length === 0 ? h('p', { class: 'empty' }, 'No routes configured.') : null,
    routes.routes.map((r) => h('section', {}, h('h2', {}, link(`#/route/${enc(r.name)}`, r.name)), h('pre', {}, JSON.stringify(r, null, 2)))));
}

// One route: its charts, where to look next, and its resolved settings.
async function routePage(name) {
  const routes = await api('GET', '/v1/routes');
  const settings = routes.routes.find((r) => r.name === name);
  show(h('h1', {}, 'Route ', h('code', {}, name)),
    h('div', { class: 'actions' }, link(`#/deliveries?route=${enc(name)}`, 'Its deliveries'), link(`#/keys?route=${enc(name)}`, 'Its keys')),
    settings ? null : h('p', { class: 'empty' }, 'No route of this name runs now; the charts show what it recorded.'),
    chartsSection(name),
    settings ? [h('h2', {}, 'Settings'), h('pre', {}, JSON.stringify(settings, null, 2))] : null);
}

// A dry run (POST /v1/try): a request pasted as it arrives, judged by the running routes
// without the app or the store. It changes nothing, so a viewer may run it too.
async function tryPage() {
  // An example on the first route's path, for a start.
  const { routes } = await api('GET', '/v1/routes');
  const matcher = routes.length ? routes[0].match : {};
  const path = matcher.path || matcher.path_prefix || '/webhooks';
  const example = `POST ${path} HTTP/1.1\nHost: hooks.example.com\nContent-Type: application/json\n\n{"id":"evt_123"}`;
  const request = h('textarea', { id: 'try-request', rows: 12, spellcheck: 'false', 'aria-describedby': 'try-help' }, example);
  const at = h('input', { id: 'try-at', placeholder: '2026-12-01T12:00:00Z', size: 24 });
  const result = h('div', { id: 'try-result', 'aria-live': 'polite' });
  const form = h('form', { onsubmit: async (event) => {
    event.preventDefault();
    const asked = { request: request.value };
    if (at.value.trim()) asked.at = at.value.trim();
    try {
      result.replaceChildren(trialReport(await api('POST', '/v1/try', asked)));
    } catch (error) {
      result.replaceChildren();
      failed(error);
    }
  } },
  h('label', {}, 'Request: the request line, headers, a blank line, the body', request),
  h('label', { class: 'inline' }, 'Judge timestamps as of', at),
  h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'primary', id: 'try-run' }, 'Try it')));
  show(h('h1', {}, 'Try a request'),
    h('p', { id: 'try-help', class: 'muted' }, 'Paste a delivery as it arrives (a captured one, or one written by hand): the running routes say what they would do with it. Nothing is sent to the app and nothing is stored. A # signed-at: line before the request line, or the field below, sets when its signature\'s timestamp is judged.'),
    form, result);
}

// What a dry run found, step by step. What the request carries (its target, host, key,
// parts) is shown with `visible`, as keys are everywhere else.
function trialReport(r) {
  const verdicts = {
    taken: 'Taken by a route',
    unverified: 'Taken if its signature verifies: not checked',
    refused: 'Refused',
    unmatched: 'No route takes it',
  };
  const answer = (a) => (a ? visible(`${a.status}${a.error ? ` ${a.error}` : ''}: ${a.detail}`) : null);
  const signature = r.signature
    ? visible([r.signature.result.replace(/_/g, ' '), r.signature.scheme ? ` (${r.signature.scheme} with ${r.signature.secrets.join(' or ')})` : '',
      r.signature.detail ? `: ${r.signature.detail}` : ''].join(''))
    : null;
  const parts = r.key ? r.key.parts.map((p) => h('li', {}, h('code', {}, visible(p.part)), ' read ',
    p.value !== undefined ? h('code', {}, visible(p.value)) : `nothing: ${p.missing}`)) : [];
  const order = r.order
    ? visible(r.order.unusable ? `unguarded: ${r.order.unusable}` : `entity ${r.order.entity}, version ${r.order.version}`)
    : null;
  return h('section', {},
    h('p', { class: `verdict ${r.verdict}`, id: 'try-verdict' }, verdicts[r.verdict] || r.verdict),
    fields([
      ['Request', visible(`${r.request.method} ${r.request.target} (host ${r.request.host || 'none'}, ${num(r.request.body_bytes)} bytes of body)`)],
      r.route ? ['Route', `${r.route.name} (scope ${r.route.scope}, ${r.route.delivery} delivery)`] : null,
      r.not_taken_by ? ['Not taken', h('ul', {}, r.not_taken_by.map((n) => h('li', {}, visible(`by ${n.route}: ${n.because}`))))] : null,
      signature ? ['Signature', signature] : null,
      r.key ? ['Key', [r.key.value ? h('code', { id: 'try-key' }, visible(r.key.value)) : '(none)', ' from ', h('code', {}, r.key.template), h('ul', {}, parts)]] : null,
      r.key && r.key.store_key ? ['Store key', h('code', {}, visible(r.key.store_key))] : null,
      order ? ['Order', order] : null,
      r.first_delivery ? ['First delivery', visible(r.first_delivery)] : null,
      r.duplicate ? ['A duplicate', answer(r.duplicate)] : null,
      r.in_flight ? ['While in flight', answer(r.in_flight)] : null,
      r.refusal ? ['Refused with', h('span', { id: 'try-refusal' }, answer(r.refusal))] : null,
    ]));
}

// ---- routing ---------------------------------------------------------------------------

async function loadSession() {
  session = await api('GET', '/v1/overview');
  showWho();
}

async function route() {
  stopPage();
  stopPage = () => {};
  const mine = ++generation;
  const page = h('div', {});
  building = page;
  let begin = null; // what the page runs once in place; gives what ends it
  let name = 'overview';
  try {
    const [path, query] = (location.hash.slice(1) || '/').split('?');
    const params = new URLSearchParams(query || '');
    const parts = path.split('/').slice(1).map(decodeURIComponent);
    name = parts[0] || 'overview';
    markNavigation(name);
    alertBox('');
    if (!session || name === 'overview') await loadSession();
    switch (name) {
      case 'overview': await overviewPage(); break;
      case 'deliveries': begin = await deliveriesPage(params); break;
      case 'delivery': await deliveryPage(parts[1]); break;
      case 'keys': await keysPage(params); break;
      case 'key': await keyPage(parts[1], parts.slice(2).join('/')); break;
      case 'held': await heldPage(); break;
      case 'routes': await routesPage(); break;
      case 'route': await routePage(parts[1]); break;
      case 'try': await tryPage(); break;
      default: show(h('p', { class: 'empty' }, 'No such page. ', link('#/', 'Overview')));
    }
  } catch (error) {
    failed(error);
  }
  // Asked for another page meanwhile: this one is dropped.
  if (mine !== generation) return;
  building = null;
  main().replaceChildren(...page.childNodes);
  const token = document.getElementById('token');
  if (token) token.focus();
  stopPage = begin ? begin() : () => {};
  document.body.dataset.page = name;
}

function markNavigation(name) {
  for (const a of document.querySelectorAll('header nav a')) {
    const current = a.dataset.page === name || (a.dataset.page === 'deliveries' && name === 'delivery') || (a.dataset.page === 'keys' && name === 'key') || (a.dataset.page === 'routes' && name === 'route');
    if (current) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
  }
}

window.addEventListener('hashchange', route);
route();
