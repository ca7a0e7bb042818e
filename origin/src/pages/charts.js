// Fanout charts, shared by the admin console (/) and the customer portal (/portal). Plain
// JavaScript, no build step, served once by `fanout serve` at /charts.js after /common.js and
// the vendored uPlot (/vendor/uPlot.iife.min.js, MIT, see /vendor/uPlot.LICENSE.txt). It
// defines one global, `FanoutCharts`, and draws what GET /v1/series answers: deliveries per
// second by outcome, latency p50 and p99, backlog and the oldest pending age, in flight against
// the configured cap (`in_flight_cap`), with pauses and breaker openings as bands behind every
// chart. Every axis says its unit; each legend shows the latest value until the pointer picks
// another bucket.
'use strict';

window.FanoutCharts = (() => {
  const { h, fmtTime } = window.FanoutPage;

  const BANDS = [
    ['paused', 'rgba(230, 160, 0, 0.22)', 'paused (Retry-After)'],
    ['breaker_open', 'rgba(200, 40, 40, 0.18)', 'breaker open'],
  ];

  /** The windows, as GET /v1/series names them; the first is the default. */
  const WINDOWS = [['15m', 'last 15 minutes'], ['1h', 'last hour'], ['1d', 'last day']];

  /**
   * The charts: [key, title, series [field, label, colour, scale], value of a point, the left
   * axis's label, the right axis's label (a series on the `age` scale)].
   */
  const CHARTS = [
    ['rate', 'Deliveries per second, by outcome', [
      ['delivered', 'delivered', '#2e7d32'],
      ['failed', 'failed', '#c62828'],
      ['deferred', 'deferred', '#b8860b'],
      ['rejected', 'rejected', '#6a1b9a'],
    ], (p, field, v) => p[field] / (v.bucket_ms / 1000), 'deliveries / s'],
    // Latencies exist only where results came in: dots, so a lone bucket shows.
    ['latency', 'Latency, p50 and p99', [
      ['p50_ms', 'p50 (ms)', '#1565c0'],
      ['p99_ms', 'p99 (ms)', '#ad1457'],
    ], (p, field) => p[field], 'milliseconds'],
    ['backlog', 'Backlog, and the age of the oldest pending delivery', [
      ['backlog', 'backlog', '#37474f'],
      ['oldest_age_ms', 'oldest age (s)', '#ef6c00', 'age'],
    ], (p, field) => (field === 'oldest_age_ms' ? p[field] / 1000 : p[field]), 'deliveries', 'seconds'],
    // The cap is the one configured now, the same in every bucket.
    ['inflight', 'In flight, against the configured cap', [
      ['in_flight', 'in flight', '#00838f'],
      ['cap', 'cap', '#9e9e9e'],
    ], (p, field, v) => (field === 'cap' ? v.in_flight_cap : p[field]), 'deliveries'],
  ];

  const fmtValue = (v) => (v == null ? '–' : Number(v).toLocaleString('en-US', { maximumFractionDigits: 2 }));

  /** Pauses and breaker openings as bands behind the series (a uPlot draw hook). */
  function bandsPlugin(view) {
    return {
      hooks: {
        drawClear: [(u) => {
          const { ctx } = u;
          const { top, height } = u.bbox;
          const step = view.bucket_ms / 1000;
          for (const [field, colour] of BANDS) {
            ctx.fillStyle = colour;
            for (const p of view.points) {
              if (!(p[field] > 0)) continue;
              const x0 = u.valToPos(p.t_ms / 1000, 'x', true);
              const x1 = u.valToPos(p.t_ms / 1000 + step, 'x', true);
              ctx.fillRect(x0, top, Math.max(1, x1 - x0), height);
            }
          }
        }],
      },
    };
  }

  /** The latest value of each series (the last bucket holding one), shown while no bucket is picked. */
  function latestValues(data) {
    return data.map((ys) => {
      for (let i = ys.length - 1; i >= 0; i--) if (ys[i] != null) return ys[i];
      return null;
    });
  }

  function chartOptions([key, title, series, , yLabel, ageLabel], width, view, latest) {
    const dots = key === 'latency';
    const scales = { x: { time: true } };
    // Ticks are the time of day in the pages' one format; the legend names the whole time.
    const ticks = (u, splits) => splits.map((secs) => fmtTime(secs * 1000, { clock: true }));
    const axes = [{ label: 'local time', labelSize: 18, values: ticks, space: 70 }, { scale: 'y', size: 52, label: yLabel, labelSize: 18 }];
    if (ageLabel) {
      scales.age = {};
      axes.push({ scale: 'age', side: 1, size: 52, label: ageLabel, labelSize: 18, grid: { show: false } });
    }
    return {
      title,
      width,
      height: 210,
      scales,
      axes,
      plugins: [bandsPlugin(view)],
      series: [
        { label: 'time', value: (u, v, si, idx) => (idx == null ? 'latest' : fmtTime(v * 1000)) },
        ...series.map(([, label, colour, scale], i) => ({
          label,
          stroke: colour,
          width: 1.5,
          scale: scale ?? 'y',
          spanGaps: false,
          points: dots ? { show: true, size: 5, fill: colour } : { show: false },
          value: (u, v, si, idx) => fmtValue(idx == null ? latest[i + 1] : v),
        })),
      ],
    };
  }

  /**
   * Mount the charts in `root`: a window and subscriber picker and four charts.
   * `call(method, path)` is the page's API call; `subscribers()` resolves to the ids that may be
   * picked ('' is every one the caller sees, combined); `allLabel` names that choice.
   */
  function mount(root, { call, subscribers, allLabel }) {
    const windowSel = h('select', { 'data-field': 'window', 'aria-label': 'Window' },
      ...WINDOWS.map(([value, label]) => h('option', { value }, label)));
    const subSel = h('select', { 'data-field': 'subscriber', 'aria-label': 'Subscriber' },
      h('option', { value: '' }, allLabel));
    const summary = h('p', { class: 'muted small chart-summary', 'data-field': 'summary' });
    const legend = h('p', { class: 'muted small chart-bands' },
      ...BANDS.map(([, colour, label]) => h('span', { class: `band-key ${label.startsWith('paused') ? 'paused' : 'open'}` }, label)));
    const grid = h('div', { class: 'chart-grid' });
    const boxes = CHARTS.map(([key]) => h('div', { class: 'chart', 'data-chart': key }));
    grid.append(...boxes);
    root.replaceChildren(
      h('div', { class: 'chart-controls' }, h('label', null, 'Window ', windowSel), h('label', null, 'Showing ', subSel)),
      summary, legend, grid,
    );
    let plots = [];
    let last = null;

    function draw(view) {
      for (const p of plots) p.destroy();
      plots = CHARTS.map((chart, i) => {
        const [, , series, value] = chart;
        const box = boxes[i];
        const width = Math.max(240, box.clientWidth || root.clientWidth || 300);
        const xs = view.points.map((p) => p.t_ms / 1000);
        const data = [xs, ...series.map(([field]) => view.points.map((p) => {
          const v = value(p, field, view);
          return v == null ? null : v;
        }))];
        box.replaceChildren();
        return new window.uPlot(chartOptions(chart, width, view, latestValues(data)), data, box);
      });
    }

    function summarize(view) {
      const pts = view.points;
      if (!pts.length) return '';
      const sum = (f) => pts.reduce((n, p) => n + (p[f] ?? 0), 0);
      const now = pts[pts.length - 1];
      const span = (WINDOWS.find(([w]) => w === view.window) ?? WINDOWS[1])[1];
      const cap = view.in_flight_cap > 0 ? `in flight ${now.in_flight} of at most ${view.in_flight_cap}` : 'no endpoint to send to';
      return `${span}: ${sum('delivered')} delivered, ${sum('failed')} failed, ${sum('deferred')} deferred; `
        + `latest bucket: backlog ${now.backlog}, oldest pending ${Math.round(now.oldest_age_ms / 1000)} s, ${cap}.`;
    }

    async function load() {
      const ids = await subscribers();
      const chosen = subSel.value;
      subSel.replaceChildren(h('option', { value: '' }, allLabel), ...ids.map((id) => h('option', { value: id }, id)));
      subSel.value = ids.includes(chosen) ? chosen : '';
      const q = new URLSearchParams({ window: windowSel.value });
      if (subSel.value) q.set('subscriber', subSel.value);
      const view = await call('GET', `/v1/series?${q}`);
      last = view;
      summary.textContent = summarize(view);
      draw(view);
      root.dataset.loaded = String(view.points.length);
      return view;
    }

    const reload = () => load().catch((e) => {
      summary.textContent = `Cannot load the charts: ${e.message}`;
    });
    windowSel.addEventListener('change', reload);
    subSel.addEventListener('change', reload);
    let resizeTimer = null;
    window.addEventListener('resize', () => {
      clearTimeout(resizeTimer);
      resizeTimer = setTimeout(() => {
        if (last && root.offsetParent !== null) draw(last);
      }, 150);
    });
    return { load };
  }

  return Object.freeze({ mount });
})();
