// The Kinetic view's pages: fetch JSON from /kinetic/api and redraw, every few seconds.
"use strict";

const REFRESH_MS = 3000;
// Everything before "/kinetic/" is Airflow's base path (for links into Airflow's own UI).
const BASE = location.pathname.slice(0, location.pathname.indexOf("/kinetic/"));

function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}
// Figures come from job files others can write: a value that is no time or number shows empty
// (toISOString throws on an invalid date, and one throw would blank the whole page).
function when(seconds) {
  const ms = Number(seconds) * 1000;
  if (!seconds || !Number.isFinite(ms) || Math.abs(ms) > 8.64e15) return "";
  return new Date(ms).toISOString().replace("T", " ").slice(0, 19) + "Z";
}
function dur(seconds) {
  if (seconds === null || seconds === undefined) return "";
  const s = Math.round(Number(seconds));
  if (!Number.isFinite(s)) return "";
  if (s < 90) return s + "s";
  if (s < 5400) return Math.round(s / 60) + "m";
  return (s / 3600).toFixed(1) + "h";
}

// A capacity ladder's rung of an attempt (kinetic_airflow.ladder): "rung 2/3 on-demand".
function rungText(job) {
  return job.rung ? `<div class="small muted">rung ${job.rung}/${job.rungs ?? "?"} ${esc(job.capacity || "")}</div>` : "";
}

function chipHours(value) {
  const v = Number(value);
  return value === null || value === undefined || !Number.isFinite(v) ? "" : v.toFixed(v >= 10 ? 1 : 3);
}
// One table row, or, if it cannot be drawn, a row that says so: the rest of the page stays.
function rowOr(draw, item, columns, name) {
  try {
    return draw(item);
  } catch (err) {
    return `<tr class="unreadable"><td colspan="${columns}">${badge("unreadable")} <span class="muted small">${esc(name(item))}: ${esc(err.message)}</span></td></tr>`;
  }
}
function list(value) {
  return Array.isArray(value) ? value : [];
}
function badge(state) {
  return `<span class="state ${esc(state)}">${esc(String(state).replace(/_/g, " "))}</span>`;
}
// A long value (an exception name, a map label, a run id) is cut to its column with the whole
// value in a tooltip, so the links column stays on screen.
function clip(value, cls = "") {
  return `<span class="clip ${cls}" title="${esc(value)}">${esc(value)}</span>`;
}
// Where a job ran: a local run shows "local CPU" (the accelerator string it was given is only
// what it asked for), and bills no chip-hours.
function device(row) {
  if (row.device && row.device !== row.accelerator) {
    if (row.accelerator === "cpu") return esc(row.device);
    return `${esc(row.device)} <span class="muted small" title="the local backend runs on this machine's CPU">for ${esc(row.accelerator)}</span>`;
  }
  return esc(row.accelerator) + (row.spot ? " (spot)" : "");
}
function tiPath(row) {
  const parts = [row.dag_id, row.run_id, row.task_id].map(encodeURIComponent);
  const mapped = row.map_index >= 0 ? `/mapped/${row.map_index}` : "";
  return `${BASE}/dags/${parts[0]}/runs/${parts[1]}/tasks/${parts[2]}${mapped}`;
}
// The sweep comparison of a mapped task: this run's members, or (across) every run's.
function sweepPath(row, across = false) {
  const path = `${BASE}/kinetic/sweep/${encodeURIComponent(row.dag_id)}/${encodeURIComponent(row.task_id)}`;
  return across ? path : path + "?run_id=" + encodeURIComponent(row.run_id);
}
function outputLink(uri) {
  if (!uri) return "";
  if (uri.startsWith("gs://")) {
    const href = "https://console.cloud.google.com/storage/browser/" + uri.slice(5);
    return `<a href="${esc(href)}" target="_blank" rel="noopener">output</a>`;
  }
  const path = uri.replace(/^file:\/\//, "");
  return `<code title="KINETIC_OUTPUT_DIR: ${esc(path)}">output</code>`;
}
function resultText(result) {
  if (!result) return "";
  if (result.ok) return `${esc(result.value_type)} ${clip(result.value_repr, "muted")}`;
  const text = `${result.error_type}: ${result.error_message}`;
  return `<span class="error clip" title="${esc(text)}">${esc(text)}</span>`;
}
// The remote traceback (the user's frames, the runner's left out), as the task log shows it.
function tracebackBlock(result) {
  if (!result || !result.traceback) return "";
  return `<h2>Traceback (phase ${esc(result.phase)})</h2><pre class="traceback">${esc(result.traceback)}</pre>`;
}
async function getJSON(path) {
  const response = await fetch(`${BASE}/kinetic/api/${path}`, { credentials: "same-origin" });
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    const detail = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail ?? response.statusText);
    throw new Error(`${response.status}: ${detail}`);
  }
  return response.json();
}
function every(draw) {
  const status = document.getElementById("status");
  const tick = async () => {
    if (document.hidden && status.textContent.startsWith("updated")) return; // not looked at
    try {
      await draw();
      status.textContent = "updated " + new Date().toLocaleTimeString();
    } catch (err) {
      status.textContent = "could not load: " + err.message;
    }
  };
  tick();
  setInterval(tick, REFRESH_MS);
}

// ---- Kinetic jobs (navigation page) ------------------------------------------------------
function jobsPage() {
  const dagSelect = document.getElementById("dag");
  const stateSelect = document.getElementById("state");
  const params = new URLSearchParams(location.search);
  const choose = (select, values, current) => {
    const keep = select.value || current || "";
    select.innerHTML = `<option value="">all</option>` + values.map((v) => `<option>${esc(v)}</option>`).join("");
    select.value = values.includes(keep) ? keep : "";
  };
  dagSelect.onchange = stateSelect.onchange = () => draw();
  async function draw() {
    const query = new URLSearchParams();
    const dag = dagSelect.value || params.get("dag_id");
    if (dag) query.set("dag_id", dag);
    if (stateSelect.value) query.set("state", stateSelect.value);
    const data = await getJSON("jobs?" + query);
    choose(dagSelect, data.dag_ids, dag);
    choose(stateSelect, data.states, stateSelect.value);
    document.getElementById("runs").innerHTML = list(data.runs).map((run) => rowOr((run) => `<tr>
        <td>${esc(run.dag_id)}</td><td>${esc(run.run_id)}</td><td class="num">${esc(run.tasks)}</td>
        <td>${Object.entries(run.states || {}).map(([s, n]) => `${badge(s)} ${esc(n)}`).join(" ")}</td>
        <td class="num">${esc(run.preemptions)}</td><td class="num">${dur(run.wall_seconds)}</td>
        <td class="num">${dur(run.run_seconds)}</td>
        <td class="num">${chipHours(run.chip_hours)}</td></tr>`, run, 8, (r) => `${r.dag_id} ${r.run_id}`)).join("")
      || `<tr><td colspan="8" class="muted">no kinetic jobs match</td></tr>`;
    document.getElementById("jobs").innerHTML = list(data.jobs).map((row) => rowOr((row) => `<tr>
        <td>${clip(row.dag_id)}</td><td class="small">${clip(row.run_id)}</td>
        <td>${clip(row.task_id)} ${clip(row.label, "muted")}</td>
        <td>${device(row)}</td><td>${esc(row.backend)}</td>
        <td>${badge(row.state)}<div class="small muted clip lines4" title="${esc(row.doing)}">${esc(row.doing)}</div></td>
        <td class="num">${row.attempts}${row.preemptions ? ` <span class="muted">(${row.preemptions} preempted)</span>` : ""}</td>
        <td class="small">${when(row.started_at)}</td><td class="num">${dur(row.duration_seconds)}</td>
        <td class="num">${chipHours(row.chip_hours)}</td>
        <td class="small">${resultText(row.result)}</td>
        <td class="small links"><a href="${tiPath(row)}" target="_top">log</a> ·
          <a href="${tiPath(row)}/plugin/kinetic-job" target="_top">job</a> · ${outputLink(row.output_dir)}${row.map_index >= 0 ? ` · <a href="${sweepPath(row)}" target="_blank" rel="noopener">sweep</a>` : ""}</td></tr>`,
      row, 12, (r) => `${r.dag_id}/${r.run_id}/${r.task_id}`)).join("")
      || `<tr><td colspan="12" class="muted">no kinetic jobs match</td></tr>`;
  }
  every(draw);
}

// ---- Kinetic (task-instance tab) -----------------------------------------------------------
function taskPage() {
  const parts = location.pathname.split("/kinetic/task/")[1].split("/").map(decodeURIComponent);
  const [dagId, runId, taskId, mapIndex] = parts;
  const api = "task/" + [dagId, runId, taskId, mapIndex].map(encodeURIComponent).join("/");
  async function draw() {
    let row;
    try {
      row = await getJSON(api);
    } catch (err) {
      if (!err.message.startsWith("404")) throw err;
      document.getElementById("summary").innerHTML = `<p class="muted">This task instance has no kinetic job (yet).</p>`;
      return;
    }
    document.getElementById("summary").innerHTML = `
      <p>${badge(row.state)} <b class="wrap">${esc(row.doing)}</b></p>
      <table><tr><th>job</th><td><code>${esc(row.job_id)}</code></td><th>accelerator</th><td>${device(row)}${row.backend === "local" ? "" : " on " + esc(row.backend)}</td></tr>
      <tr><th>node</th><td>${esc(row.node)}</td><th>attempts</th><td>${row.attempts}${row.preemptions ? ` (${row.preemptions} preempted)` : ""}</td></tr>
      <tr><th>chip-hours</th><td>${chipHours(row.chip_hours)}</td><th>output</th><td>${outputLink(row.output_dir)}</td></tr>
      <tr><th>result</th><td colspan="3">${resultText(row.result)}</td></tr></table>
      ${tracebackBlock(row.result)}`;
    document.getElementById("attempts").innerHTML = list(row.jobs).slice().reverse().map((job) => rowOr((job) => `<tr>
        <td class="num">${job.try_number ?? ""}</td><td class="num">${job.attempt ?? ""}${rungText(job)}</td>
        <td><code>${esc(job.job_id)}</code></td><td>${badge(job.state)}<div class="small muted wrap">${esc(job.doing)}</div></td>
        <td class="small">${when(job.submitted_at)}</td><td class="num">${dur(job.queue_seconds)}</td>
        <td class="num">${dur(job.duration_seconds)}</td><td class="num">${job.chips ?? ""}</td>
        <td class="num">${chipHours(job.chip_hours)}</td></tr>`, job, 9, (j) => j.job_id)).join("");
    document.getElementById("history").innerHTML = list(row.history).slice().reverse().map((h) => rowOr((h) => `<tr>
        <td class="small">${when(h.time)}</td><td>${badge(h.state)}</td><td>${esc(h.text)}</td></tr>`, h, 3, () => "a change")).join("");
    const sweep = document.getElementById("sweep-link");
    if (row.map_index >= 0) {
      sweep.innerHTML = `<a href="${sweepPath(row)}" target="_blank" rel="noopener">compare the sweep</a> ·
        <a href="${sweepPath(row, true)}" target="_blank" rel="noopener">across runs</a>`;
    }
    await drawTaskMetrics(api.replace(/^task\//, "metrics/"));
  }
  every(draw);
}

// ---- Metrics: charts (uPlot, vendored in static/uplot) ---------------------------------------
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#65a30d",
  "#4b5563", "#ea580c"];
function num(value) {
  if (value === null || value === undefined) return "";
  const v = Number(value);
  return Math.abs(v) >= 1e4 || (v !== 0 && Math.abs(v) < 1e-3) ? v.toExponential(3) : v.toPrecision(4);
}
// A value axis's labels: short (7.998M, not 7,998,000, which uPlot's fixed 50-pixel axis cut to
// "0,000"), with as many decimals as the step between ticks needs to tell them apart.
const UNITS = [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
function axisValues(_u, splits) {
  const finite = splits.filter((v) => Number.isFinite(v));
  const top = Math.max(0, ...finite.map(Math.abs));
  if (top !== 0 && (top < 1e-3 || top >= 1e15)) return splits.map((v) => (Number.isFinite(v) ? v.toExponential(2) : ""));
  const [scale, unit] = UNITS.find(([s]) => top >= s) || [1, ""];
  const step = finite.length > 1 ? Math.abs(finite[1] - finite[0]) / scale : 1;
  let digits = step > 0 ? Math.max(0, -Math.floor(Math.log10(step))) : 0;
  if (digits < 6 && Math.abs(step * 10 ** digits - Math.round(step * 10 ** digits)) > 1e-6) digits += 1;
  const label = (v) => (v === 0 ? "0" : (v / scale).toFixed(Math.min(digits, 6)) + unit);
  return splits.map((v) => (Number.isFinite(v) ? label(v) : ""));
}
// The axis as wide as its longest label (uPlot measures with its own font), so none is cut.
function axisSize(u, values, axisIdx, cycleNum) {
  const axis = u.axes[axisIdx];
  if (cycleNum > 1) return axis._size; // uPlot settles the size in a few cycles: keep the last
  u.ctx.font = axis.font[0];
  const longest = Math.max(0, ...(values || []).map((v) => u.ctx.measureText(String(v)).width / devicePixelRatio));
  return Math.ceil(longest + axis.ticks.size + axis.gap + 6);
}
// Aligned data for uPlot from several [[x, y], ...] series: the union of their x values.
function aligned(seriesPoints) {
  const xs = [...new Set(seriesPoints.flatMap((pts) => pts.map((p) => p[0])))].sort((a, b) => a - b);
  const index = new Map(xs.map((x, i) => [x, i]));
  const ys = seriesPoints.map((pts) => {
    const y = new Array(xs.length).fill(undefined);
    for (const [x, v] of pts) y[index.get(x)] = v;
    return y;
  });
  return [xs, ...ys];
}
// One chart, kept across refreshes: new data goes into the same uPlot (no flicker, zoom kept).
function chart(holder, key, title, labels, data, opts = {}) {
  holder.charts = holder.charts || new Map();
  let entry = holder.charts.get(key);
  const signature = [title, opts.xLabel, opts.logX, ...labels].join("|");
  if (!entry || entry.signature !== signature) {
    if (entry) entry.plot.destroy();
    const el = entry ? entry.el : document.createElement("div");
    el.className = "kn-chart";
    el.dataset.metric = key;
    if (!entry) holder.appendChild(el);
    const width = opts.width || 480;
    const series = [{ label: opts.xLabel || "step" }, ...labels.map((label, i) => ({
      label,
      stroke: COLORS[i % COLORS.length],
      width: 1.5,
      dash: opts.dashed && opts.dashed[i] ? [6, 4] : undefined,
      spanGaps: false,
      paths: opts.scatter ? () => null : undefined,
      points: opts.scatter ? { show: true, size: 9, fill: COLORS[i % COLORS.length] } : undefined,
    }))];
    const plot = new uPlot({
      title, width, height: opts.height || 220, series,
      scales: { x: { time: false, distr: opts.logX ? 3 : 1 } },
      axes: [{ label: opts.xLabel || "step" }, { values: axisValues, size: axisSize }],
    }, data, el);
    entry = { el, plot, signature };
    holder.charts.set(key, entry);
  } else {
    entry.plot.setData(data);
  }
  // For readers and tests: how many points the chart holds now.
  entry.el.dataset.points = String(data.slice(1).reduce((n, ys) => n + ys.filter((v) => v !== undefined && v !== null).length, 0));
  return entry;
}
function dropStaleCharts(holder, keep) {
  for (const [key, entry] of holder.charts || []) {
    if (!keep.has(key)) { entry.plot.destroy(); entry.el.remove(); holder.charts.delete(key); }
  }
}

// The Kinetic tab's curves: one chart per metric, one series per attempt of the newest try (an
// attempt after a preemption continues the curve, dashed and named so).
async function drawTaskMetrics(api) {
  const holder = document.getElementById("charts");
  let data;
  try {
    data = await getJSON(api);
  } catch (err) {
    if (err.message.startsWith("404")) return;
    throw err;
  }
  const note = document.getElementById("metrics-note");
  if (!data.metrics.length) {
    note.textContent = "No metrics reported (yet): call kinetic_airflow.report(step=..., loss=...) or use kinetic_airflow.keras.MetricsCallback() in the function.";
    dropStaleCharts(holder, new Set());
    return;
  }
  note.innerHTML = Object.keys(data.final).sort().map((name) =>
    `<span class="metric"><b>${esc(name)}</b> ${num(data.final[name])} <span class="muted">(best ${num(data.best[name])})</span></span>`).join(" ");
  const labels = data.attempts.map((a, i) => i === 0 ? `attempt ${a.attempt}` : `attempt ${a.attempt} (after preemption)`);
  const dashed = data.attempts.map((_a, i) => i > 0);
  for (const name of data.metrics) {
    const series = data.attempts.map((a) => a.points[name] || []);
    chart(holder, name, name, labels, aligned(series), { dashed });
  }
  dropStaleCharts(holder, new Set(data.metrics));
}

// ---- Sweep comparison ----------------------------------------------------------------------
function sweepPage() {
  const [dagId, taskId] = location.pathname.split("/kinetic/sweep/")[1].split("/").map(decodeURIComponent);
  const params = new URLSearchParams(location.search);
  const query = params.get("run_id") ? "?run_id=" + encodeURIComponent(params.get("run_id")) : "";
  const api = "sweep/" + [dagId, taskId].map(encodeURIComponent).join("/") + query;
  document.getElementById("title").textContent = `${dagId} · ${taskId}` + (params.get("run_id") ? ` · ${params.get("run_id")}` : " · every run");
  const metricSelect = document.getElementById("metric");
  const paramSelect = document.getElementById("param");
  let sort = null; // {key: "final:loss", desc: false}
  let last = null;
  const options = (select, values, preferred) => {
    const keep = select.value || preferred;
    const html = values.map((v) => `<option>${esc(v)}</option>`).join("");
    if (select.dataset.values !== html) { select.innerHTML = html; select.dataset.values = html; }
    if (values.includes(keep)) select.value = keep;
  };
  metricSelect.onchange = paramSelect.onchange = () => last && render(last);
  function value(member, key) {
    if (key === "label" || key === "state") return member[key];
    if (key === "map_index" || key === "chip_hours") return member[key];
    const [kind, name] = key.split(":");
    return member[kind] ? member[kind][name] : undefined;
  }
  function sorted(members) {
    const { key, desc } = sort;
    return members.slice().sort((a, b) => {
      const x = value(a, key), y = value(b, key);
      if (x === y) return a.map_index - b.map_index;
      if (x === undefined || x === null) return 1;
      if (y === undefined || y === null) return -1;
      return (x < y ? -1 : 1) * (desc ? -1 : 1);
    });
  }
  function render(data) {
    const metrics = data.metrics;
    options(metricSelect, metrics, metrics.includes("loss") ? "loss" : metrics[0]);
    options(paramSelect, data.params, data.params[0]);
    const metric = metricSelect.value;
    if (!sort && metric) sort = { key: "final:" + metric, desc: !!data.higher_is_better[metric] };
    sort = sort || { key: "map_index", desc: false };
    const columns = [["map_index", "#"], ["label", "label"], ["state", "state"],
      ...metrics.flatMap((m) => [["final:" + m, m + " final"], ["best:" + m, m + " best"]]), ["chip_hours", "chip-hours"]];
    document.getElementById("head").innerHTML = "<tr>" + columns.map(([key, text]) =>
      `<th data-key="${esc(key)}" class="sortable">${esc(text)}${sort.key === key ? (sort.desc ? " ▼" : " ▲") : ""}</th>`).join("") + "</tr>";
    for (const th of document.querySelectorAll("#head th")) {
      th.onclick = () => {
        const key = th.dataset.key;
        sort = sort.key === key ? { key, desc: !sort.desc } : { key, desc: key.startsWith("best:") || key.startsWith("final:") ? !!data.higher_is_better[key.split(":")[1]] : false };
        render(data);
      };
    }
    document.getElementById("members").innerHTML = data.runs.map((run) => `
      <tr class="run"><td colspan="${columns.length}"><b>${esc(run.run_id)}</b> <span class="muted small">${esc(run.run_after || "")}</span></td></tr>` +
      sorted(run.members).map((m) => `<tr class="member" data-run="${esc(run.run_id)}" data-map-index="${m.map_index}">
        <td class="num">${m.map_index}</td><td>${clip(m.label)}</td><td>${badge(m.state)}</td>
        ${metrics.map((name) => `<td class="num">${num(m.final[name])}</td><td class="num">${num(m.best[name])}</td>`).join("")}
        <td class="num">${chipHours(m.chip_hours)}</td></tr>`).join("")).join("")
      || `<tr><td colspan="${columns.length}" class="muted">no mapped kinetic task instances</td></tr>`;
    const members = data.runs.flatMap((run) => run.members.map((m) => ({ ...m, run_id: run.run_id })));
    const manyRuns = data.runs.length > 1;
    const overlay = document.getElementById("overlay");
    if (metric) {
      const shown = members.slice(0, COLORS.length * 5);
      chart(overlay, "overlay", `${metric} per member`, shown.map((m) => (manyRuns ? m.run_id + " · " : "") + (m.label || "#" + m.map_index)),
        aligned(shown.map((m) => m.curves[metric] || [])), { width: 640, height: 300 });
    }
    const scatter = document.getElementById("scatter");
    const param = paramSelect.value;
    if (metric && param) {
      const pairs = members.map((m) => [m.params[param], m.final[metric]])
        .filter(([x, y]) => typeof x === "number" && typeof y === "number").sort((a, b) => a[0] - b[0]);
      const xs = pairs.map((p) => p[0]);
      const logX = xs.length > 1 && xs[0] > 0 && xs[xs.length - 1] / xs[0] >= 100;
      chart(scatter, "scatter", `final ${metric} against ${param}`, [`final ${metric}`],
        [xs, pairs.map((p) => p[1])], { scatter: true, xLabel: param, logX, width: 480, height: 300 });
    }
  }
  every(async () => { last = await getJSON(api); render(last); });
}
