/*
 * report.js — draws qctrain's memory report from the page's data (<script id="qc-data">).
 * Charts are drawn by the inlined libraries (dygraphs: timeline and curves; Chart.js: the
 * bars); without one, its charts become tables and a notice says why. Each section renders on
 * its own: an error in one is shown in that section (and logged) and the others still render.
 * Figures the tests read carry exact values in data-* attributes (id fig-*).
 */
(function () {
  'use strict';

  var D = null;
  var HAVE_DYGRAPHS = typeof window.Dygraph === 'function';
  var HAVE_CHART = typeof window.Chart === 'function';
  var COLORS = ['#4e79a7', '#f28e2b', '#e15759', '#76b7b2', '#59a14f', '#edc948', '#b07aa1',
    '#ff9da7', '#9c755f', '#bab0ac', '#1f77b4', '#d62728', '#7f7f7f', '#17becf'];
  /* the allocator trace's event kinds (docs/TRACE.md) */
  var EV_KINDS = { 1: 'alloc', 2: 'free', 3: 'ready', 4: 'map', 5: 'unmap', 6: 'oom', 7: 'step',
    8: 'offload_put', 9: 'offload_get', 10: 'recompute' };
  /* how the timeline marks them: a dashed line across the chart, or a tick of `tick` pixels */
  var MARK_STYLE = {
    unmap: { color: '#7f7f7f', label: 'unmaps (cache releases; grey dashed lines)' },
    oom: { color: '#d62728', label: 'out-of-memory failures (red dashed lines)' },
    offload_put: { color: '#1f77b4', tick: 14, label: 'offload puts (blue ticks)' },
    offload_get: { color: '#2ca02c', tick: 10, label: 'offload fetches (green ticks)' },
    recompute: { color: '#ff7f0e', tick: 18, label: 'recomputes (orange ticks)' }
  };

  // ---- helpers ---------------------------------------------------------------------------------

  function fmtBytes(b) {
    if (b === null || b === undefined || isNaN(b)) return '—';
    var units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
    var v = Math.abs(b), i = 0;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    var s = i === 0 ? String(Math.round(v)) : v.toFixed(v < 10 ? 2 : v < 100 ? 1 : 0);
    return (b < 0 ? '-' : '') + s + ' ' + units[i];
  }
  /* Axis ticks at round binary steps (1, 2, 4, 8 ... x 1024^k bytes: 64 MiB, not 47.7 MiB),
   * 4 to 10 of them over [lo, hi]. */
  function binaryTicks(lo, hi) {
    lo = Math.min(0, lo);
    if (!(hi > lo)) return [{ v: 0, label: '0 B' }];
    var step = 1;
    while ((hi - lo) / step > 8) step *= 2;
    var out = [];
    for (var v = Math.ceil(lo / step) * step; v <= hi + 1e-9; v += step) {
      out.push({ v: v, label: fmtBytes(v) });
    }
    return out;
  }
  function dygraphBinaryTicker(min, max) { return binaryTicks(min, max); }
  /* True when every value of the series is 0 or missing (the chart would draw a flat line on an
   * axis of "1 B"). A value may be [lo, mean, hi]. */
  function allZero(values) {
    return values.every(function (v) {
      if (v === null || v === undefined) return true;
      if (Array.isArray(v)) return v.every(function (x) { return !x; });
      return !v;
    });
  }
  function fmtInt(n) {
    return Number(n).toLocaleString('en-US');
  }
  function fmtNum(v) {
    if (v === null || v === undefined) return '—';
    if (typeof v !== 'number') return String(v);
    if (Number.isInteger(v) && Math.abs(v) < 1e15) return fmtInt(v);
    return Math.abs(v) >= 1e-3 && Math.abs(v) < 1e6 ? v.toPrecision(5) : v.toExponential(4);
  }
  function shortNum(v) {
    if (v === 0) return '0';
    var a = Math.abs(v);
    return a >= 1e-3 && a < 1e6 ? String(Number(v.toPrecision(3))) : v.toExponential(1);
  }
  function stepLabel(v) { return Number.isInteger(v) ? fmtInt(v) : ''; }
  /* The legend: the series' colours when nothing is hovered, else text(row). */
  function legendWith(title, text) {
    return function (data) {
      if (data.x === null || data.x === undefined) {
        return title + ': ' + data.series.map(function (s) {
          return '<span class="swatch" style="background:' + s.color + '"></span>' + s.labelHTML;
        }).join(' &nbsp;');
      }
      return text(data);
    };
  }
  function fmtUnit(v, unit) {
    return unit === 'bytes' ? fmtBytes(v) : fmtNum(v) + (unit && unit !== '1/s' ? ' ' + unit : '');
  }
  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    if (attrs) Object.keys(attrs).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }
  function add(parent, child) { parent.appendChild(child); return child; }
  function note(parent, text, cls) {
    return add(parent, el('div', { 'class': 'notice' + (cls ? ' ' + cls : '') }, text));
  }
  function body(id) {
    return document.querySelector('#' + id + ' .body') || document.getElementById(id);
  }
  function get(o, path, dflt) {
    var parts = path.split('.');
    for (var i = 0; i < parts.length; i++) {
      if (o === null || o === undefined || typeof o !== 'object') return dflt;
      o = o[parts[i]];
    }
    return o === undefined ? dflt : o;
  }

  /* A table from rows of cells; cols: [{label, num, sort}] (sort: sortable by click). Each
   * cell is text or {text, sort, attrs}. */
  function table(parent, cols, rows, id) {
    var t = el('table', id ? { id: id } : null);
    var tr = add(add(t, el('thead')), el('tr'));
    cols.forEach(function (c, ci) {
      var th = add(tr, el('th', { 'class': (c.num ? 'num ' : '') + (c.sort ? 'sortable' : '') },
        c.label));
      if (c.sort) th.addEventListener('click', function () { sortTable(t, ci, c.num); });
    });
    var tb = add(t, el('tbody'));
    rows.forEach(function (r) {
      var row = add(tb, el('tr'));
      r.forEach(function (cell, ci) {
        var isObj = cell !== null && typeof cell === 'object';
        var td = add(row, el('td', isObj && cell.attrs ? cell.attrs : null,
          isObj ? cell.text : cell));
        if (cols[ci].num) td.classList.add('num');
        if (isObj && cell.sort !== undefined) td.setAttribute('data-sort', cell.sort);
      });
    });
    add(parent, t);
    return t;
  }
  function sortTable(t, ci, numeric) {
    var tb = t.tBodies[0];
    var rows = Array.prototype.slice.call(tb.rows);
    var dir = t.getAttribute('data-sort-col') === String(ci) &&
      t.getAttribute('data-sort-dir') === 'desc' ? 'asc' : 'desc';
    function key(r) {
      var c = r.cells[ci];
      var s = c.hasAttribute('data-sort') ? c.getAttribute('data-sort') : c.textContent;
      return numeric ? parseFloat(s) || 0 : s.toLowerCase();
    }
    rows.sort(function (a, b) {
      var x = key(a), y = key(b);
      var c = x < y ? -1 : x > y ? 1 : 0;
      return dir === 'asc' ? c : -c;
    });
    rows.forEach(function (r) { tb.appendChild(r); });
    t.setAttribute('data-sort-col', String(ci));
    t.setAttribute('data-sort-dir', dir);
  }
  function fig(parent, label, id, text, attrs) {
    var f = add(parent, el('div', { 'class': 'fig' }));
    add(f, el('b', null, label));
    var a = attrs || {};
    if (id) a.id = id;
    add(f, el('span', a, text));
  }
  function bytesCell(b) { return { text: fmtBytes(b), sort: b, attrs: { title: fmtInt(b) + ' bytes' } }; }

  /* Zoom of dygraphs charts kept together. */
  function syncX(graphs) {
    var busy = false;
    graphs.forEach(function (g) {
      g.updateOptions({
        drawCallback: function (me, initial) {
          if (busy || initial) return;
          busy = true;
          var range = me.xAxisRange();
          graphs.forEach(function (o) {
            if (o !== me) o.updateOptions({ dateWindow: range });
          });
          busy = false;
        }
      }, true);
    });
  }

  // ---- header ----------------------------------------------------------------------------------

  function renderHeader() {
    var sub = document.getElementById('subtitle');
    var m = D.memory || {};
    sub.textContent = D.run_dir + ' · ' + (m.device || '?') + ' · step ' + m.step + ' of ' +
      m.total_steps + ' · written ' + D.generated;
    var box = document.getElementById('notices');
    [['dygraphs', HAVE_DYGRAPHS, 'the timeline and the curves are shown as tables'],
      ['chartjs', HAVE_CHART, 'the bar chart of the blocks is not drawn (the table has every figure)']]
      .forEach(function (l) {
        var info = get(D, 'libs.' + l[0], {});
        if (!l[1]) {
          note(box, (info.name || l[0]) + ' was not found when this report was written (' +
            (info.path || '?') + '): ' + l[2] + '. Install Debian\'s ' + (info['package'] || '') +
            ' (tools/install-deps) and run qctrain report again for charts.').id = 'lib-missing-' + l[0];
        }
      });
    /* a run that stopped early says why, first */
    var stop = get(D, 'memory.stopped', null);
    if (stop) {
      var on = !(stop.world_size > 1) ? '' : stop.rank >= 0 ? ' on rank ' + stop.rank + ' of ' +
        stop.world_size + (stop.failed_ranks > 1 ? ', the first of ' + stop.failed_ranks +
        ' ranks that failed' : '') : ' of ' + stop.world_size + ' ranks';
      var n = note(box, 'The run stopped at step ' + stop.step + ' (' + stop.reason + on + '): ' +
        stop.message, 'error');
      n.id = 'stopped';
      n.setAttribute('data-reason', String(stop.reason));
      n.setAttribute('data-step', String(stop.step));
      if (stop.world_size > 1) n.setAttribute('data-rank', String(stop.rank));
    }
    (D.notes || []).forEach(function (t) { note(box, t); });
  }

  // ---- timeline --------------------------------------------------------------------------------

  function renderTimeline() {
    var b = body('timeline');
    var T = D.timeline;
    if (!T) {
      add(b, el('p', { 'class': 'muted' }, 'No allocation trace was recorded for this run.'));
      return;
    }
    var avail = (T.available || []).map(function (a) {
      return a.step + ' (' + a.reasons.join(', ') + ')';
    }).join(', ');
    add(b, el('p', null, 'Step ' + T.step + ' (' + T.reasons.join(', ') + '): ' +
      fmtInt(T.events) + ' allocator events in ' + fmtNum(T.duration_ms) + ' ms; peak ' +
      fmtBytes(T.bytes_allocated_peak) + ' allocated, ' + fmtBytes(T.bytes_reserved_peak) +
      ' reserved' + (T.merged > 1 ? '; every point merges ' + T.merged +
        ' events and shows the one with the most allocated bytes' : '') +
      (T.events_lost ? '; the ring had dropped the step\'s first ' + fmtInt(T.events_lost) +
        ' events' : '') + '.'));
    var ooms = (T.available || []).filter(function (a) { return a.reasons.indexOf('oom') >= 0; });
    if (ooms.length) {
      var p = add(b, el('p', { 'class': 'notice error', id: 'timeline-ooms',
        'data-steps': ooms.map(function (a) { return a.step; }).join(','),
        'data-shown': String(T.step) }, 'Steps that ran out of memory and were re-planned: ' +
        ooms.map(function (a) {
          return a.step + ' (' + (a.oom_events || 0) + ' failed allocations, ' +
            (a.replans || 0) + ' re-plans)';
        }).join(', ') + '. ' + (T.reasons.indexOf('oom') >= 0 ? 'This is step ' + T.step +
          ', the worst of them (the most failed allocations and re-plans).' :
          'qctrain report RUN --step N shows one.')));
      p.setAttribute('data-count', String(ooms.length));
    }
    add(b, el('p', { 'class': 'muted' }, 'Steps with a trace: ' + avail +
      '. Another one: qctrain report RUN --step N. Hover for the event (tensor tag, bytes, ' +
      'time); drag to zoom, double-click to reset.'));
    var budget = get(D, 'memory.budget_bytes', 0);
    var used = [];
    T.groups.forEach(function (g, k) {
      if (T.stack.some(function (row) { return row[k] !== 0; })) used.push(k);
    });
    if (!T.x.length) { /* e.g. a step that failed before it allocated */
      add(b, el('p', { 'class': 'muted', id: 'timeline-empty' },
        'The allocator recorded no event in this step.'));
      return;
    }
    if (!HAVE_DYGRAPHS) {
      timelineTables(b, T, used);
      return;
    }
    var legend1 = add(b, el('div', { 'class': 'legend-box', id: 'timeline-legend' }));
    var div1 = add(b, el('div', { 'class': 'chart', id: 'timeline-stack' }));
    /* dygraphs stacks its last series at the bottom: what lives through the step (parameters,
     * optimizer state) goes there, the step's activations above it */
    var order = used.slice().reverse();
    var rows1 = T.x.map(function (x, i) {
      return [x].concat(order.map(function (k) { return T.stack[i][k]; }));
    });
    function hover(data) {
      var i = data.dygraph.getSelection();
      if (i < 0 || i >= T.ev.length) return '';
      var ev = T.ev[i];
      var t = document.createElement('span');
      t.textContent = 't = ' + fmtNum(T.x[i]) + ' ms · ' + (EV_KINDS[ev[0]] || 'event ' + ev[0]) +
        ' ' + (T.tags[ev[1]] || '(untagged)') + ' · ' + fmtBytes(ev[2]) + ' · allocated ' +
        fmtBytes(T.allocated[i]) + ', reserved ' + fmtBytes(T.reserved[i]);
      return t.outerHTML;
    }
    /* unmaps and OOMs: dashed lines across the chart; the memory system's offload puts, fetches
     * and recomputes: short ticks along its bottom edge (there are many), one colour each */
    function marks(canvas, area, g) {
      (T.marks || []).forEach(function (m) {
        var xc = g.toDomXCoord(m.x), style = MARK_STYLE[m.kind] || MARK_STYLE.unmap;
        canvas.strokeStyle = style.color;
        canvas.setLineDash(style.tick ? [] : [4, 3]);
        canvas.beginPath();
        canvas.moveTo(xc, style.tick ? area.y + area.h - style.tick : area.y);
        canvas.lineTo(xc, area.y + area.h);
        canvas.stroke();
      });
      canvas.setLineDash([]);
    }
    var yAxis = { valueFormatter: fmtBytes, axisLabelFormatter: fmtBytes, axisLabelWidth: 70,
      ticker: dygraphBinaryTicker };
    var g1 = new window.Dygraph(div1, rows1, {
      labels: ['time (ms)'].concat(order.map(function (k) { return T.groups[k]; })),
      stackedGraph: true, fillGraph: true, fillAlpha: 0.6, strokeWidth: 0.8,
      colors: order.map(function (k) { return COLORS[k % COLORS.length]; }),
      labelsDiv: legend1, legend: 'always',
      legendFormatter: legendWith('allocated by block group (stacked)', hover),
      xlabel: 'ms since the step began', axes: { y: yAxis }, underlayCallback: marks
    });
    var legend2 = add(b, el('div', { 'class': 'legend-box' }));
    var div2 = add(b, el('div', { 'class': 'chart small', id: 'timeline-totals' }));
    var labels2 = ['time (ms)', 'allocated', 'reserved'];
    if (budget > 0) labels2.push('budget');
    var rows2 = T.x.map(function (x, i) {
      var r = [x, T.allocated[i], T.reserved[i]];
      if (budget > 0) r.push(budget);
      return r;
    });
    var g2 = new window.Dygraph(div2, rows2, {
      labels: labels2, labelsDiv: legend2, legend: 'always', strokeWidth: 1.5,
      colors: ['#4e79a7', '#e15759', '#111111'], xlabel: 'ms since the step began',
      axes: { y: yAxis }, underlayCallback: marks,
      legendFormatter: legendWith('totals', hover)
    });
    syncX([g1, g2]);
    timelineMarks(b, T);
    timelineGroupTable(b, T, used);
  }

  /* The marks of the step by kind, as text (and data-<kind> counts): what the chart's lines and
   * ticks show, also readable without it. */
  function timelineMarks(b, T) {
    var count = {}, attrs = { 'class': 'muted', id: 'timeline-marks' };
    (T.marks || []).forEach(function (m) { count[m.kind] = (count[m.kind] || 0) + 1; });
    var parts = Object.keys(MARK_STYLE).map(function (k) {
      attrs['data-' + k] = String(count[k] || 0);
      return (count[k] || 0) + ' ' + MARK_STYLE[k].label;
    });
    add(b, el('p', attrs, 'Marks in this step: ' + parts.join(', ') + '.'));
  }

  /* Live bytes by group at the step's allocated peak. */
  function timelineGroupTable(b, T, used) {
    var best = 0;
    T.allocated.forEach(function (a, i) { if (a > T.allocated[best]) best = i; });
    add(b, el('h3', null, 'At the step\'s peak (t = ' + fmtNum(T.x[best]) + ' ms)'));
    var total = T.allocated[best] || 1;
    table(b, [{ label: 'block group', sort: true }, { label: 'bytes', num: true, sort: true },
      { label: 'share', num: true, sort: true }],
    used.map(function (k) {
      var v = T.stack[best][k];
      return [T.groups[k], bytesCell(v), { text: (100 * v / total).toFixed(1) + ' %', sort: v }];
    }), 'timeline-groups');
  }

  function timelineTables(b, T, used) {
    timelineMarks(b, T);
    timelineGroupTable(b, T, used);
    add(b, el('h3', null, 'Events (every ' + Math.max(1, Math.ceil(T.x.length / 200)) +
      'th point)'));
    var step = Math.max(1, Math.ceil(T.x.length / 200)), rows = [];
    for (var i = 0; i < T.x.length; i += step) {
      var ev = T.ev[i];
      rows.push([fmtNum(T.x[i]), EV_KINDS[ev[0]] || String(ev[0]), T.tags[ev[1]] || '',
        bytesCell(ev[2]), bytesCell(T.allocated[i]), bytesCell(T.reserved[i])]);
    }
    var s = add(b, el('div', { 'class': 'scroll' }));
    table(s, [{ label: 'ms' }, { label: 'event' }, { label: 'tag' }, { label: 'bytes', num: true },
      { label: 'allocated', num: true }, { label: 'reserved', num: true }], rows, 'timeline-table');
  }

  // ---- blocks ----------------------------------------------------------------------------------

  function renderBlocks() {
    var b = body('blocks');
    var m = D.memory, a = m.allocator || {}, p = m.peak || {};
    var figs = add(b, el('div', { 'class': 'figs' }));
    /* several ranks: the headline is the largest rank's peak (what decides whether the job
     * fits), the per-rank table beside it; the other figures are rank 0's */
    var ranks = get(m, 'dist.ranks', []) || [];
    if (ranks.length > 1) {
      var top = ranks[0];
      ranks.forEach(function (r) { if (r.peak_allocated_bytes > top.peak_allocated_bytes) top = r; });
      fig(figs, 'peak allocated (largest of ' + ranks.length + ' ranks: rank ' + top.rank + ')',
        'fig-peak-allocated', fmtBytes(top.peak_allocated_bytes) + ' (' +
        fmtInt(top.peak_allocated_bytes) + ' bytes)', { 'data-bytes': String(top.peak_allocated_bytes),
        'data-rank': String(top.rank) });
      fig(figs, 'rank 0 peak allocated', 'fig-peak-allocated-rank0', fmtBytes(a.bytes_allocated_peak),
        { 'data-bytes': String(a.bytes_allocated_peak) });
    } else {
      fig(figs, 'peak allocated', 'fig-peak-allocated', fmtBytes(a.bytes_allocated_peak) + ' (' +
        fmtInt(a.bytes_allocated_peak) + ' bytes)', { 'data-bytes': String(a.bytes_allocated_peak) });
    }
    fig(figs, 'peak reserved', 'fig-peak-reserved', fmtBytes(a.bytes_reserved_peak),
      { 'data-bytes': String(a.bytes_reserved_peak) });
    fig(figs, 'fragmentation', 'fig-fragmentation',
      typeof a.fragmentation === 'number' ? a.fragmentation.toFixed(3) : '—',
      { 'data-value': String(a.fragmentation) });
    fig(figs, 'budget', 'fig-budget', m.budget_bytes ? fmtBytes(m.budget_bytes) : 'unlimited',
      { 'data-bytes': String(m.budget_bytes) });
    fig(figs, 'params + grads', null, fmtBytes(m.params_grads_bytes));
    fig(figs, 'peak RSS', null, fmtBytes(m.peak_rss_bytes));
    add(b, el('p', { 'class': 'muted' }, 'Breakdown at step ' + p.step + ': ' +
      fmtBytes(p.snapshot_bytes_allocated) + ' live in ' + fmtInt(p.blocks) + ' blocks and ' +
      fmtInt(p.tags) + ' tags (the snapshot is within 1 % below the true peak, ' +
      'docs/MEMORY_REPORT.md). Click a column to sort.'));
    if (ranks.length > 1) {
      add(b, el('h3', null, 'Per rank (' + ranks.length + ' ranks, ZeRO stage ' +
        get(m, 'dist.zero_stage', '?') + '); the breakdown below is rank 0\'s'));
      table(b, [{ label: 'rank', num: true, sort: true }, { label: 'peak allocated', num: true, sort: true },
        { label: 'params', num: true, sort: true }, { label: 'grads (reduced)', num: true, sort: true },
        { label: 'AdamW moments', num: true, sort: true }, { label: 'comm buffers', num: true, sort: true }],
      ranks.map(function (r) {
        return [{ text: String(r.rank), sort: r.rank }, bytesCell(r.peak_allocated_bytes),
          bytesCell(r.params_bytes), { text: fmtBytes(r.grads_bytes) + ' (' +
            fmtBytes(r.grads_reduced_bytes) + ')', sort: r.grads_bytes },
          bytesCell(r.moments_bytes), bytesCell(r.comm_bytes)];
      }), 'ranks-table');
    }
    var plan = m.plan || null;
    var planBy = {};
    if (plan) renderPlan(b, plan, p, planBy);
    var grid = add(b, el('div', { 'class': 'grid2' }));
    var left = add(grid, el('div'));
    var right = add(grid, el('div'));
    add(left, el('h3', null, 'By block'));
    var cols = [{ label: 'block', sort: true }, { label: 'group', sort: true },
      { label: 'bytes', num: true, sort: true }, { label: 'share', num: true, sort: true },
      { label: 'allocations', num: true, sort: true }];
    if (plan) cols.push({ label: 'policy', sort: true }, { label: 'predicted', num: true, sort: true });
    var rows = (p.by_block || []).map(function (e) {
      var r = [e.name, e.other ? '' : (D.groups_of_blocks || {})[e.name] || '', bytesCell(e.bytes),
        { text: (100 * e.share).toFixed(1) + ' %', sort: e.share }, fmtInt(e.allocations)];
      if (plan) {
        var pb = planBy[e.name];
        r.push(pb ? pb.policy : '—', pb ? bytesCell(pb.bytes) : { text: '—', sort: -1 });
      }
      return r;
    });
    add(left, el('div', { 'class': 'scroll' })).appendChild(
      table(document.createDocumentFragment(), cols, rows, 'blocks-table'));
    add(left, el('h3', null, 'By tag'));
    add(left, el('div', { 'class': 'scroll' })).appendChild(table(document.createDocumentFragment(),
      [{ label: 'tag', sort: true }, { label: 'bytes', num: true, sort: true },
        { label: 'share', num: true, sort: true }, { label: 'allocations', num: true, sort: true }],
      (p.by_tag || []).map(function (e) {
        return [e.name, bytesCell(e.bytes), { text: (100 * e.share).toFixed(1) + ' %', sort: e.share },
          fmtInt(e.allocations)];
      }), 'tags-table'));
    add(right, el('h3', null, 'Bytes by block at the peak'));
    if (!HAVE_CHART) {
      add(right, el('p', { 'class': 'muted' }, 'Chart.js is missing: the table has every figure.'));
      return;
    }
    var box = add(right, el('div', { style: 'position: relative; height: ' +
      Math.max(300, 22 * (p.by_block || []).length) + 'px' }));
    var canvas = add(box, el('canvas', { id: 'blocks-chart' }));
    var sets = [{ label: 'measured', data: (p.by_block || []).map(function (e) { return e.bytes; }),
      backgroundColor: '#4e79a7' }];
    if (plan) {
      sets.push({ label: 'planned (predicted)', data: (p.by_block || []).map(function (e) {
        return planBy[e.name] ? planBy[e.name].bytes : null;
      }), backgroundColor: '#f28e2b' });
    }
    new window.Chart(canvas.getContext('2d'), {
      type: 'bar',
      data: { labels: (p.by_block || []).map(function (e) { return e.name; }), datasets: sets },
      options: {
        indexAxis: 'y', responsive: true, maintainAspectRatio: false, animation: false,
        plugins: { legend: { display: !!plan }, tooltip: { callbacks: {
          label: function (c) { return c.dataset.label + ': ' + fmtBytes(c.raw) + ' (' + fmtInt(c.raw) + ' B)'; }
        } } },
        scales: { x: { ticks: { callback: function (v) { return fmtBytes(v); } },
          afterBuildTicks: function (axis) {
            axis.ticks = binaryTicks(axis.min, axis.max).map(function (t) { return { value: t.v }; });
          } },
          y: { ticks: { autoSkip: false, font: { size: 10 } } } }
      }
    });
  }

  function renderPlan(b, plan, peak, planBy) {
    add(b, el('h3', null, 'The plan at step ' + plan.step));
    var figs = add(b, el('div', { 'class': 'figs' }));
    fig(figs, 'predicted peak', 'fig-plan-predicted', fmtBytes(plan.predicted_peak_bytes),
      { 'data-bytes': String(plan.predicted_peak_bytes) });
    fig(figs, 'measured peak', 'fig-plan-measured', fmtBytes(plan.measured_peak_bytes),
      { 'data-bytes': String(plan.measured_peak_bytes) });
    var err = plan.predicted_peak_bytes ?
      100 * (plan.measured_peak_bytes - plan.predicted_peak_bytes) / plan.predicted_peak_bytes : 0;
    fig(figs, 'measured vs predicted', null, (err >= 0 ? '+' : '') + err.toFixed(1) + ' %');
    var measured = {};
    (peak.by_block || []).forEach(function (e) { measured[e.name] = e.bytes; });
    (plan.blocks || []).forEach(function (pb) { planBy[pb.name] = pb; });
    /* each planned row's own measured bytes (report_plan.c: its tensors' most live bytes in the
     * plan step's trace); a memory.json without them falls back to the block of that name */
    var sumP = 0, sumM = 0, nM = 0;
    (plan.blocks || []).forEach(function (pb) {
      if (typeof pb.measured_bytes === 'number') { sumP += pb.bytes; sumM += pb.measured_bytes; nM++; }
    });
    if (nM) {
      fig(figs, 'stash measured / planned', 'fig-plan-stash', fmtBytes(sumM) + ' / ' +
        fmtBytes(sumP) + ' over ' + nM + ' rows', { 'data-measured': String(sumM),
        'data-planned': String(sumP), 'data-rows': String(nM) });
      add(b, el('p', { 'class': 'muted' }, 'Measured bytes: what each planned block\'s tensors ' +
        'held live at most, from the ' + (plan.measured_from || 'trace') + ' (allocator tags ' +
        'read as planned names: "edges/pl2a.r" is edges.pl2a, ".../app4.stash" is .../app4).'));
    } else if ((plan.blocks || []).length) {
      add(b, el('p', { 'class': 'muted' }, 'The plan\'s step has no trace in this run folder: ' +
        'only blocks whose name is an allocator block show a measured figure.'));
    }
    table(b, [{ label: 'block', sort: true }, { label: 'policy', sort: true },
      { label: 'predicted bytes', num: true, sort: true },
      { label: 'measured bytes', num: true, sort: true },
      { label: 'predicted time (s)', num: true, sort: true }],
    (plan.blocks || []).map(function (pb) {
      var mb = typeof pb.measured_bytes === 'number' ? pb.measured_bytes : measured[pb.name];
      return [pb.name, pb.policy, bytesCell(pb.bytes),
        mb === undefined ? { text: '—', sort: -1 } : bytesCell(mb),
        { text: fmtNum(pb.predicted_time_s), sort: pb.predicted_time_s }];
    }), 'plan-table');
  }

  // ---- what holds the peak ---------------------------------------------------------------------

  /* Every byte live at the peak of the peak step, by owner (report_holders.c), in the words of
   * `qctrain plan`'s floor (the owners and knobs of src/plan/qc_plan_owners.h): the kinds, then
   * every holder with its bytes, whether a stash policy can move it and what moves it. */
  function renderHolders() {
    var b = body('holders');
    var H = D.holders;
    if (!H) {
      add(b, el('p', { 'class': 'muted', id: 'holders-none' }, 'The run folder keeps no ' +
        'allocation trace of the peak step: nothing to say what holds the peak (the notes at ' +
        'the top say why).'));
      return;
    }
    var kinds = {}, owners = {};
    (H.kinds || []).forEach(function (k) { kinds[k.key] = k; });
    (H.owners || []).forEach(function (o) { owners[o.key] = o; });
    var sum = 0, movable = 0;
    (H.rows || []).forEach(function (r) { sum += r.bytes; if (r.movable) movable += r.bytes; });
    function share(v) {
      var s = H.peak_bytes ? v / H.peak_bytes : 0;
      return { text: (100 * s).toFixed(1) + ' %', sort: s };
    }
    var figs = add(b, el('div', { 'class': 'figs' }));
    fig(figs, 'peak of step ' + H.step, 'fig-holders-peak', fmtBytes(H.peak_bytes) + ' (' +
      fmtInt(H.peak_bytes) + ' bytes)', { 'data-bytes': String(H.peak_bytes),
      'data-step': String(H.step), 'data-step-peak': String(H.step_peak_bytes) });
    fig(figs, 'running at the peak', 'fig-holders-block', H.block || '(the step\'s start)',
      H.tag ? { title: 'the allocation that made the peak: ' + H.tag } : null);
    fig(figs, 'a stash policy can move', 'fig-holders-movable', fmtBytes(movable),
      { 'data-bytes': String(movable) });
    fig(figs, 'no policy moves', 'fig-holders-unmovable', fmtBytes(sum - movable),
      { 'data-bytes': String(sum - movable) });
    add(b, el('p', { 'class': 'muted' }, 'Every byte live at the highest point of step ' +
      H.step + ' (the ' + H.from + '), by owner, in the words `qctrain plan` explains its floor ' +
      'with: fixed bytes, stashes (read by the op running there: no policy moves them), ' +
      'tensors no policy moves (an edge set\'s dL/dr among them), the working set of the op at ' +
      'the peak. Click a column to sort.'));
    add(b, el('h3', null, 'By kind'));
    table(b, [{ label: 'kind' }, { label: 'bytes', num: true }, { label: 'share', num: true },
      { label: 'what moves it' }],
    (H.kinds || []).filter(function (k) { return (H.by_kind || {})[k.key]; }).map(function (k) {
      var v = H.by_kind[k.key];
      return [{ text: k.name, attrs: { 'data-kind': k.key } }, bytesCell(v), share(v), k.knob];
    }), 'holders-kinds');
    add(b, el('h3', null, 'Every holder (' + (H.rows || []).length + ')'));
    var rows = (H.rows || []).map(function (r) {
      var o = owners[r.owner] || {};
      /* a stash its block reads there: no policy moves it at this point */
      var knob = r.kind === 'stash_read' && kinds.stash_read ? kinds.stash_read.knob : o.knob;
      return [{ text: r.name, attrs: { 'data-owner': r.owner, 'data-kind': r.kind } },
        o.label || r.owner, (kinds[r.kind] || {}).name || r.kind, bytesCell(r.bytes),
        share(r.bytes), { text: r.count ? fmtInt(r.count) : '\u2014', sort: r.count },
        r.movable ? 'yes' : 'no', knob || ''];
    });
    add(b, el('div', { 'class': 'scroll' })).appendChild(table(document.createDocumentFragment(),
      [{ label: 'holder', sort: true }, { label: 'owner', sort: true }, { label: 'kind', sort: true },
        { label: 'bytes', num: true, sort: true }, { label: 'share', num: true, sort: true },
        { label: 'allocations', num: true, sort: true }, { label: 'a policy moves it', sort: true },
        { label: 'what moves it' }], rows, 'holders-table'));
    add(b, el('p', { 'class': 'muted', id: 'holders-sum', 'data-bytes': String(sum) },
      'The holders add up to ' + fmtInt(sum) + ' bytes' + (sum === H.peak_bytes ?
        ': the peak, byte for byte.' : ', not the peak\'s ' + fmtInt(H.peak_bytes) +
        ' (the notes at the top say why).')));
  }

  // ---- curves ----------------------------------------------------------------------------------

  var CHARTS = [
    ['loss', 'loss and its terms'], ['lr', 'learning rate'], ['speed', 'samples/s'],
    ['memory', 'device memory per step'], ['offload', 'bytes offloaded and recomputed per step'],
    ['stall', 'prefetch stall (s)'], ['plan', 're-plans, splits and skipped scenes'],
    ['plan_time', 'planning time per step (ms)'],
    ['eval_loss', 'validation loss'], ['eval_dist', 'validation displacement errors (m)'],
    ['eval_rate', 'validation miss rate and Brier'], ['eval_heading', 'validation heading errors (rad)']
  ];

  /* What a chart whose every value is zero says instead. */
  var ZERO_TEXT = {
    offload: 'Nothing offloaded or recomputed in any step: every stash was kept on the device.',
    stall: 'No prefetch stall in any step.',
    plan: 'No re-plan, split or skipped scene in any step.'
  };

  function renderCurves() {
    var b = body('curves');
    var C = D.curves || {};
    if (!C.lines) {
      add(b, el('p', { 'class': 'muted' }, 'No step was logged in metrics.jsonl.'));
      return;
    }
    add(b, el('p', null, fmtInt(C.lines) + ' steps logged' + (C.bucket > 1 ? ', drawn as ' +
      C.x.length + ' buckets of ' + C.bucket + ' steps: the line is the bucket mean, the band ' +
      'its minimum and maximum' : '') + (C.eval && C.eval.lines ? '; ' + C.eval.lines +
      ' validations' : '') + '.'));
    var meta = D.metrics || [];
    var graphs = [];
    CHARTS.forEach(function (ch) {
      var isEval = ch[0].indexOf('eval_') === 0;
      var src = isEval ? C.eval : C;
      if (!src || !src.series) return;
      var ms = meta.filter(function (m) {
        return m.chart === ch[0] && m.eval === isEval && src.series[m.key];
      });
      if (!ms.length) return;
      var unit = ms[0].unit;
      add(b, el('h3', null, ch[1]));
      if (ms.every(function (m) { return allZero(src.series[m.key]); })) {
        /* nothing to draw: say so instead of a flat line on an axis of "1 B" */
        add(b, el('p', { 'class': 'muted', id: 'curve-' + ch[0] + '-none' },
          ZERO_TEXT[ch[0]] || 'Zero in every step.'));
        return;
      }
      if (!HAVE_DYGRAPHS) {
        curveTable(b, src, ms, ch[0]);
        return;
      }
      var legend = add(b, el('div', { 'class': 'legend-box' }));
      var div = add(b, el('div', { 'class': 'chart small', id: 'curve-' + ch[0] }));
      var rows = src.x.map(function (x, i) {
        return [x].concat(ms.map(function (m) { return src.series[m.key][i]; }));
      });
      var fmt = function (v) { return fmtUnit(v, unit); };
      var axisFmt = unit === 'bytes' ? fmtBytes : shortNum;
      var g = new window.Dygraph(div, rows, {
        labels: ['step'].concat(ms.map(function (m) { return m.key; })), customBars: true,
        labelsDiv: legend, legend: 'always', xlabel: 'step', strokeWidth: 1.4,
        drawPoints: src.x.length < 60, connectSeparatedPoints: true,
        colors: COLORS.slice(0, ms.length),
        axes: { y: unit === 'bytes' ? { valueFormatter: fmt, axisLabelFormatter: axisFmt,
          axisLabelWidth: 70, ticker: dygraphBinaryTicker } :
          { valueFormatter: fmt, axisLabelFormatter: axisFmt, axisLabelWidth: 70 },
        x: { axisLabelFormatter: stepLabel } }
      });
      if (!isEval) graphs.push(g);
    });
    if (graphs.length > 1) syncX(graphs);
  }

  function curveTable(b, src, ms, id) {
    var step = Math.max(1, Math.ceil(src.x.length / 50)), rows = [];
    for (var i = 0; i < src.x.length; i += step) {
      rows.push([fmtInt(src.x[i])].concat(ms.map(function (m) {
        var v = src.series[m.key][i];
        return v ? fmtUnit(v[1], m.unit) : '—';
      })));
    }
    table(b, [{ label: 'step' }].concat(ms.map(function (m) { return { label: m.key, num: true }; })),
      rows, 'curve-table-' + id);
  }

  // ---- run -------------------------------------------------------------------------------------

  function kvTable(parent, obj, id, bytesKeys) {
    var rows = [];
    Object.keys(obj || {}).forEach(function (k) {
      var v = obj[k];
      if (v !== null && typeof v === 'object') v = JSON.stringify(v);
      var isBytes = bytesKeys && /bytes/.test(k) && typeof v === 'number';
      rows.push([k, isBytes ? fmtBytes(v) + ' (' + fmtInt(v) + ')' : fmtNum(v)]);
    });
    return table(parent, [{ label: 'key' }, { label: 'value' }], rows, id);
  }

  function flatten(o, prefix, out) {
    Object.keys(o || {}).forEach(function (k) {
      var v = o[k], key = prefix ? prefix + '.' + k : k;
      if (v !== null && typeof v === 'object' && !Array.isArray(v)) flatten(v, key, out);
      else out[key] = v;
    });
    return out;
  }

  function renderRun() {
    var b = body('run');
    var R = D.run, m = D.memory || {};
    var grid = add(b, el('div', { 'class': 'grid2' }));
    var left = add(grid, el('div')), right = add(grid, el('div'));
    add(left, el('h3', null, 'Run'));
    var runInfo = {
      'run folder': D.run_dir, device: m.device, 'steps done': m.step, 'steps planned': m.total_steps,
      'first step of this process': R ? R.first_step : null, resumed: R ? String(R.resumed) : null,
      started: R ? R.started : null, 'report written': D.generated
    };
    kvTable(left, runInfo, 'run-table');
    if (R) {
      add(left, el('h3', null, 'Machine and device'));
      kvTable(left, Object.assign({}, flatten(R.machine, 'machine', {}),
        flatten(R.device, 'device', {})), 'machine-table', true);
      add(left, el('h3', null, 'Versions'));
      kvTable(left, R.versions, 'versions-table');
    } else {
      note(left, 'run.json was not found in the run folder: no configuration, machine or ' +
        'version information (runs of qctrain before this report existed).');
    }
    add(right, el('h3', null, 'Allocator statistics (run-wide)'));
    var stats = Object.assign({}, m.allocator || {});
    var C = D.curves || {};
    var rp = C.series && C.series.replans;
    var lastRp = (rp || []).filter(function (v) { return v !== null; }).pop();
    stats['re-plans'] = lastRp ? lastRp[2] : 'not recorded';
    kvTable(right, stats, 'alloc-table', true);
    if (R && R.config) {
      add(b, el('h3', null, 'Effective configuration (qctrain config --config-dump)'));
      var s = add(b, el('div', { 'class': 'scroll' }));
      kvTable(s, flatten(R.config, '', {}), 'config-table');
    }
  }

  // ---- main ------------------------------------------------------------------------------------

  function guarded(id, fn) {
    try {
      fn();
    } catch (e) {
      console.error('qctrain report: section ' + id + ': ' + (e && e.stack ? e.stack : e));
      note(body(id), 'This section could not be drawn: ' + e, 'error');
    }
  }

  function main() {
    D = JSON.parse(document.getElementById('qc-data').textContent);
    guarded('notices', renderHeader);
    guarded('timeline', renderTimeline);
    guarded('blocks', renderBlocks);
    guarded('holders', renderHolders);
    guarded('curves', renderCurves);
    guarded('run', renderRun);
    document.body.setAttribute('data-rendered', 'yes');
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', main);
  else main();
})();
