// The fanout console: reads api/status every few seconds and renders it,
// and posts an operator's actions (pause, resume, drain a client) to
// api/pause, api/resume and api/drain-client with the same token.
// Every value from the document goes into the page as text (textContent,
// attributes), never as markup: client names come from the network.
'use strict';

(function () {
  const TOKEN_KEY = 'fanout.metricsToken';
  const SVG = 'http://www.w3.org/2000/svg';
  const CHART_W = 300;
  const CHART_H = 80;
  const MIN_WINDOW_S = 60;
  const SERIES = [
    ['consumed', 'Consumed'],
    ['delivered', 'Delivered'],
    ['acked', 'Acked'],
    ['redelivered', 'Redelivered'],
  ];

  const $ = (id) => document.getElementById(id);
  let timer = 0;

  // el makes an element with attributes and children (strings become text).
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== undefined && v !== null) e.setAttribute(k, String(v));
    }
    for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return e;
  }

  function svg(tag, attrs) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
    return e;
  }

  function setText(id, v) { $(id).textContent = String(v); }

  function fmtNum(v) { return Number(v).toLocaleString('en-US'); }

  function fmtRate(v) {
    if (v >= 100) return fmtNum(Math.round(v));
    if (v >= 10) return v.toFixed(1);
    return v.toFixed(2);
  }

  // fmtAge is the time from `from` to `to` (both RFC 3339), short.
  function fmtAge(from, to) {
    return fmtSeconds(Math.max(0, (Date.parse(to) - Date.parse(from)) / 1000));
  }

  function fmtSeconds(s) {
    if (s < 10) return s.toFixed(1) + ' s';
    if (s < 120) return Math.round(s) + ' s';
    if (s < 7200) return Math.round(s / 60) + ' min';
    return Math.round(s / 3600) + ' h';
  }

  // The token: from the address's fragment once (#token=...), which is then
  // dropped from the address bar, or typed into the form; kept in this tab's
  // sessionStorage and sent as a bearer token.
  function tokenFromFragment() {
    const m = /(?:^|&)token=([^&]*)/.exec(location.hash.slice(1));
    if (!m) return;
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(m[1]));
    history.replaceState(null, '', location.pathname + location.search);
  }

  function askToken(reason) {
    setText('token-reason', reason);
    $('token-form').hidden = false;
    $('overview').hidden = true;
    setText('title', 'token needed');
  }

  function showError(msg) {
    const e = $('error');
    e.textContent = msg;
    e.hidden = false;
  }

  function schedule(seconds) {
    clearTimeout(timer);
    timer = setTimeout(load, Math.max(1, seconds || 2) * 1000);
  }

  async function load() {
    const headers = { Accept: 'application/json' };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = 'Bearer ' + token;
    let res;
    try {
      res = await fetch('api/status', { headers, cache: 'no-store' });
    } catch (err) {
      showError('Cannot reach the daemon: ' + err.message);
      return schedule();
    }
    if (res.status === 401) {
      if (token) sessionStorage.removeItem(TOKEN_KEY);
      askToken(token ? 'The daemon refused that token.' : 'This daemon needs its metrics token.');
      return;
    }
    if (!res.ok) {
      showError('The daemon answered ' + res.status + ' ' + res.statusText);
      return schedule();
    }
    let st;
    try {
      st = await res.json();
    } catch (err) {
      showError('The daemon sent an unreadable document: ' + err.message);
      return schedule();
    }
    $('error').hidden = true;
    $('token-form').hidden = true;
    render(st);
    schedule(st.rates && st.rates.interval_seconds);
  }

  // renderTitle names the topic, then the service and the node when they
  // say something the topic does not: nothing is said twice.
  function renderTitle(st, node) {
    const said = [st.topic];
    const sub = [];
    for (const [label, v] of [['service', st.id], ['node', node.node_id]]) {
      if (v && !said.includes(v)) {
        sub.push(label + ' ' + v);
        said.push(v);
      }
    }
    setText('title', st.topic || '?');
    setText('subtitle', sub.join(' · '));
    document.title = [st.topic, node.node_id].filter((v, i, a) => v && a.indexOf(v) === i).join(' · ') + ' — fanout console';
  }

  function render(st) {
    const node = st.node || {};
    renderTitle(st, node);
    const role = $('node-role');
    role.textContent = node.role || 'unknown';
    role.className = 'badge ' + (node.role || '');
    setText('updated', node.time ? new Date(node.time).toLocaleTimeString() : '');
    $('overview').hidden = false;

    setText('mode', st.mode || 'unknown');
    setText('leader', st.leader ? st.leader.node : 'none');
    setText('epoch', st.leader ? st.leader.epoch : '–');
    setText('member-count', (st.members || []).length);
    setText('client-count', fmtNum(node.clients || 0));
    setText('in-flight', fmtNum(node.in_flight || 0));
    setText('buffered', fmtNum(node.buffered || 0) + (node.paused ? ' (paused)' : ''));
    setText('total-lag', fmtNum(st.total_lag || 0));
    const ready = $('ready');
    ready.textContent = node.ready ? 'yes' : 'no';
    ready.title = node.reason || '';
    ready.className = node.ready ? 'ok' : 'bad';
    // Not ready: why, in red, where it is seen first.
    const notReady = $('not-ready');
    notReady.hidden = !!node.ready;
    notReady.textContent = node.ready ? '' : 'Not ready: ' + (node.reason || 'no reason given') + '.';

    const deliveries = $('deliveries');
    deliveries.textContent = node.delivery_paused ? 'paused' : 'flowing';
    deliveries.className = node.delivery_paused ? 'bad' : 'ok';
    renderWarnings(node.warnings || []);

    const note = $('follower-note');
    note.hidden = false;
    // The reason of a node not ready is above already.
    const why = node.ready ? (node.reason || 'Not serving') + '. ' : '';
    if (node.partial) {
      note.textContent = 'Only the partitions this member serves are shown: ' + node.partial + '.';
    } else if (node.serving) {
      note.hidden = true;
    } else if (node.mode === 'spread') {
      note.textContent = why + 'Each member of a spread cluster shows its own clients.';
    } else {
      note.textContent = why +
        'Partitions and clients are shown by the console of the node that serves them' +
        (st.leader ? ' (' + st.leader.node + (st.leader.addr ? ', clients at ' + st.leader.addr : '') + ').' : '.');
    }

    renderActions(st, node);
    renderCharts(st.rates);
    renderMembers(st);
    renderSpread(st);
    renderPartitions(st.partitions || []);
    renderClients(st.clients || [], node.time, !!node.actions_enabled);
  }

  // renderWarnings lists what the operator should look at; the reasons the
  // node is not ready are in the line above it already, and a pause is
  // said where it can be undone (renderActions).
  function renderWarnings(warnings) {
    const list = $('warnings');
    const shown = warnings.filter((w) => !w.unready && w.kind !== 'delivery-paused');
    list.replaceChildren(...shown.map((w) => el('li', { 'data-warning': w.kind }, w.message + '.')));
    list.hidden = shown.length === 0;
  }

  // ago is how long before the document's time t was, short.
  function ago(t, now) { return now ? fmtAge(t, now) + ' ago' : new Date(t).toLocaleTimeString(); }

  // renderActions shows whether deliveries flow, who paused or resumed them
  // last, the buttons (only with a metrics token: without one the daemon
  // takes no action) and the node's last actions.
  function renderActions(st, node) {
    const p = st.pause;
    const paused = !!node.delivery_paused;
    let state = paused ? 'Deliveries are paused' : 'Deliveries flow';
    if (p && p.paused === paused) {
      state += (paused ? ' by ' : '; resumed by ') + p.by + ' on ' + p.node + ', ' + ago(p.at, node.time);
    }
    setText('delivery-state', state + '.');
    $('delivery-state').className = 'delivery-state ' + (paused ? 'bad' : 'ok');
    const enabled = !!node.actions_enabled;
    $('pause-button').hidden = !enabled || paused;
    $('resume-button').hidden = !enabled || !paused;
    const note = $('actions-note');
    note.hidden = enabled;
    note.textContent = enabled ? '' : 'Actions need the metrics token, and this daemon has none: ' +
      'start it with --metrics-token-file to pause, resume or drain a client from here.';
    const recent = (node.actions || []).slice(-5).reverse();
    $('recent-actions').replaceChildren(...recent.map((a) => el('li', { 'data-action': a.kind },
      new Date(a.at).toLocaleTimeString() + ' ' + a.kind + (a.target ? ' ' + a.target : '') + ' by ' + a.by +
      (a.result ? ': ' + a.result : ''))));
    $('recent-actions').hidden = recent.length === 0;
  }

  function showResult(text, failed) {
    const r = $('action-result');
    r.textContent = text;
    r.className = failed ? 'error' : 'done';
    r.hidden = false;
  }

  // act posts an action with the token and shows what came of it.
  async function act(path, body, doing, done) {
    const buttons = document.querySelectorAll('#actions button, #clients button');
    for (const b of buttons) b.disabled = true;
    showResult(doing + '…', false);
    const headers = { 'Content-Type': 'application/json', Accept: 'application/json' };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = 'Bearer ' + token;
    try {
      let res;
      try {
        res = await fetch('api/' + path, { method: 'POST', headers, body: JSON.stringify(body), cache: 'no-store' });
      } catch (err) {
        showResult('Cannot reach the daemon: ' + err.message, true);
        return;
      }
      const text = await res.text();
      if (res.status === 401) {
        if (token) sessionStorage.removeItem(TOKEN_KEY);
        askToken('The daemon refused that token.');
        return;
      }
      if (!res.ok) {
        showResult(text.trim() || res.status + ' ' + res.statusText, true);
        return;
      }
      let answer = {};
      try {
        answer = JSON.parse(text);
      } catch (err) {
        // the action was taken; the next document shows it
      }
      showResult(done(answer), false);
    } finally {
      for (const b of buttons) b.disabled = false;
    }
    load();
  }

  function pauseDone(a) {
    const p = a.pause || {};
    return p.paused ? 'Deliveries paused (version ' + p.version + '): every member stops handing messages out.' :
      'Deliveries resumed (version ' + p.version + ').';
  }

  // row makes a table row; each cell is [label, text, class] and carries its
  // column's label for the narrow layout.
  function row(cells, attrs) {
    const tr = el('tr', attrs);
    for (const [label, text, cls] of cells) tr.append(el('td', { 'data-label': label, class: cls }, text));
    return tr;
  }

  function fillBody(table, rows, empty) {
    const body = $(table).tBodies[0];
    const cols = $(table).tHead.rows[0].cells.length;
    if (rows.length === 0) rows = [el('tr', { class: 'empty' }, el('td', { colspan: cols }, empty))];
    body.replaceChildren(...rows);
  }

  function renderMembers(st) {
    const now = st.node && st.node.time;
    const leader = st.leader && st.leader.node;
    fillBody('members', (st.members || []).map((m) => row([
      ['Node', m.node_id, 'node'],
      ['Address', m.addr || '–', 'addr'],
      ['Role', m.role, 'role'],
      ['Mode', m.mode || '–', 'mode'],
      ['Store', m.offset_store || '–', 'store'],
      ['Epoch', m.epoch, 'num'],
      ['Last heartbeat', now ? fmtAge(m.last_seen, now) + ' ago' : m.last_seen, 'num'],
      memberReady(m),
    ], { class: m.node_id === leader ? 'leader' : null, 'data-node': m.node_id })), 'No members heard from.');
  }

  // memberReady is the Ready cell of a member: yes, or no and why (red), or
  // – when its heartbeats do not say (an older daemon).
  function memberReady(m) {
    if (m.ready === undefined || m.ready === null) return ['Ready', '–', 'ready'];
    if (m.ready) return ['Ready', 'yes', 'ready ok'];
    return ['Ready', 'no: ' + (m.reason || 'no reason given'), 'ready bad'];
  }

  // ranges writes ascending partitions as ranges: 0-2, 5.
  function ranges(ps) {
    const out = [];
    for (let i = 0; i < ps.length; i++) {
      let j = i;
      while (j + 1 < ps.length && ps[j + 1] === ps[j] + 1) j++;
      out.push(j > i ? ps[i] + '-' + ps[j] : String(ps[i]));
      i = j;
    }
    return out.length ? out.join(', ') : 'none';
  }

  // renderSpread shows the assignment of a spread cluster and its handoffs.
  function renderSpread(st) {
    const a = st.assignment;
    $('spread').hidden = !a;
    if (!a) return;
    setText('assignment-generation', 'generation ' + a.generation + ', epoch ' + a.epoch);
    fillBody('assignment', (a.members || []).map((m) => {
      const all = (m.partitions || []).length;
      const owned = (m.owned || []).length;
      return row([
        ['Member', m.node_id, 'node'],
        ['Address', m.addr || '–', 'addr'],
        ['Partitions', ranges(m.partitions || []), 'num partitions'],
        ['Owned', ranges(m.owned || []), 'num owned' + (owned < all ? ' behind' : '')],
        ['Lag', fmtNum(m.lag || 0), 'num lag' + (m.lag > 0 ? ' behind' : '')],
      ], { 'data-member': m.node_id, class: st.leader && m.node_id === st.leader.node ? 'leader' : null });
    }), 'No members in the assignment.');
    fillBody('handoffs', (st.handoffs || []).map((h) => row([
      ['Partition', h.partition, 'num partition'],
      ['From', h.from || '–', 'from'],
      ['To', h.to, 'to'],
      ['State', h.state, 'state'],
    ], { 'data-handoff': h.partition })), 'None in progress: every partition is served by the member assigned it.');
  }

  // partitionState says what holds a partition back: held, stalled, dead
  // letters pending.
  function partitionState(p) {
    const s = [];
    if (p.held) s.push('held');
    if (p.stalled) s.push('stalled');
    if (p.dead_letters_pending) s.push(fmtNum(p.dead_letters_pending) + ' dead letters pending');
    return s;
  }

  function renderPartitions(parts) {
    fillBody('partitions', parts.map((p) => {
      const state = partitionState(p);
      return row([
        ['Partition', p.partition, 'num partition'],
        ['Owner', p.owner || '–', 'owner'],
        ['Committed', p.committed === null ? 'none' : fmtNum(p.committed), 'num committed'],
        ['High watermark', fmtNum(p.high_watermark), 'num high-watermark'],
        ['Lag', p.lag === null ? '–' : fmtNum(p.lag), 'num lag' + (p.lag > 0 ? ' behind' : '')],
        ['State', state.length ? state.join(', ') : '–', 'state' + (state.length ? ' behind' : '')],
      ], { 'data-partition': p.partition });
    }), 'No partitions served by this node.');
  }

  function renderClients(clients, now, actions) {
    const weights = clients.some((c) => c.weight !== undefined && c.weight !== null);
    $('clients').classList.toggle('no-weight', !weights);
    $('clients').classList.toggle('no-actions', !actions);
    const worker = (c, v) => (c.role === 'observer' ? '–' : fmtNum(v || 0));
    fillBody('clients', clients.map((c) => row([
      ['Name', (c.name || '(no name)') + (c.identity ? ' · ' + c.identity : ''), 'name'],
      ['Address', c.addr || '–', 'addr'],
      ['Role', c.role, 'role'],
      ['Weight', c.weight === undefined || c.weight === null ? '–' : c.weight, 'num weight'],
      ['In flight', c.role === 'observer' ? '–' : fmtNum(c.in_flight) + ' / ' + fmtNum(c.max_in_flight), 'num in-flight'],
      ['Acked', fmtNum(c.acked), 'num acked'],
      ['Nacked', worker(c, c.nacked), 'num nacked'],
      ['Timed out', worker(c, c.timed_out), 'num timed-out'],
      ['Redelivered', worker(c, c.redelivered), 'num redelivered'],
      ['Dead-lettered', worker(c, c.dead_lettered), 'num dead-lettered'],
      ['Acks/s', fmtRate(c.acks_per_second), 'num acks-per-second'],
      ['Connected', now ? fmtAge(c.connected_at, now) : c.connected_at, 'num'],
      ['', c.draining ? 'draining…' : el('button', { type: 'button', class: 'drain', 'data-drain': c.id, 'data-name': c.name || '' }, 'Drain'), 'act'],
    ], { 'data-client': c.id, class: c.draining ? 'draining' : null })), 'No clients connected.');
  }

  // niceMax rounds v up to 1, 2 or 5 times a power of ten (at least 1).
  function niceMax(v) {
    if (!(v > 1)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }

  function renderCharts(rates) {
    const box = $('charts');
    const points = (rates && rates.points) || [];
    if (box.children.length === 0) {
      for (const [key, label] of SERIES) {
        const plot = svg('svg', {
          class: 'chart ' + key, viewBox: '0 0 ' + CHART_W + ' ' + CHART_H, preserveAspectRatio: 'none',
          role: 'img', 'aria-label': label + ' per second', 'data-series': key,
        });
        plot.append(svg('path', { class: 'grid', d: 'M0 ' + CHART_H / 2 + 'H' + CHART_W }));
        plot.append(svg('polygon', { class: 'area' }));
        plot.append(svg('polyline', { class: 'line' }));
        box.append(el('figure', { class: 'chart-box', 'data-series': key },
          el('figcaption', {}, el('span', { class: 'label' }, label), el('span', { class: 'value' }, '–')),
          el('div', { class: 'plot' }, el('span', { class: 'ymax' }, ''), plot),
          el('div', { class: 'axis' }, el('span', { class: 'from' }, ''), el('span', {}, 'now'))));
      }
    }
    const last = points.length ? Date.parse(points[points.length - 1].time) : 0;
    const span = points.length ? (last - Date.parse(points[0].time)) / 1000 : 0;
    const windowS = Math.max(MIN_WINDOW_S, span);
    // One scale for every chart, so that their heights compare.
    let peak = 0;
    for (const [key] of SERIES) for (const p of points) peak = Math.max(peak, p[key] || 0);
    const top = niceMax(peak);
    setText('rate-scale', 'per second, on one scale up to ' + fmtNum(top));
    for (const [key] of SERIES) {
      const fig = box.querySelector('figure[data-series="' + key + '"]');
      const plot = fig.querySelector('svg');
      const values = points.map((p) => p[key] || 0);
      const xy = points.map((p, i) => {
        const x = CHART_W - ((last - Date.parse(p.time)) / 1000 / windowS) * CHART_W;
        const y = CHART_H - (values[i] / top) * CHART_H;
        return x.toFixed(1) + ',' + y.toFixed(1);
      });
      plot.querySelector('.line').setAttribute('points', xy.join(' '));
      const area = xy.length ? [xy[0].split(',')[0] + ',' + CHART_H, ...xy, CHART_W + ',' + CHART_H] : [];
      plot.querySelector('.area').setAttribute('points', area.join(' '));
      plot.setAttribute('data-points', String(points.length));
      plot.setAttribute('data-max', String(Math.max(0, ...values)));
      plot.setAttribute('data-top', String(top));
      fig.querySelector('.value').textContent = values.length ? fmtRate(values[values.length - 1]) + '/s' : '–';
      fig.querySelector('.ymax').textContent = fmtNum(top);
      fig.querySelector('.from').textContent = '−' + fmtSeconds(windowS);
    }
  }

  $('token-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const v = $('token').value.trim();
    if (!v) return;
    sessionStorage.setItem(TOKEN_KEY, v);
    $('token').value = '';
    load();
  });

  $('pause-button').addEventListener('click', () =>
    act('pause', {}, 'Pausing the deliveries', pauseDone));
  $('resume-button').addEventListener('click', () =>
    act('resume', {}, 'Resuming the deliveries', pauseDone));
  $('clients').addEventListener('click', (ev) => {
    const b = ev.target.closest('button.drain');
    if (!b) return;
    const name = b.getAttribute('data-name') || 'session ' + b.getAttribute('data-drain');
    act('drain-client', { id: Number(b.getAttribute('data-drain')) }, 'Draining ' + name, () =>
      'Draining ' + name + ': it gets no more deliveries; what it holds goes to the other clients unless it acks it.');
  });

  tokenFromFragment();
  load();
})();
