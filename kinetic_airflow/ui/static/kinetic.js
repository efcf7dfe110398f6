// The Kinetic view's pages: fetch JSON from /kinetic/api and redraw, every few seconds.
"use strict";

const REFRESH_MS = 3000;
// Everything before "/kinetic/" is Airflow's base path (for links into Airflow's own UI).
const BASE = location.pathname.slice(0, location.pathname.indexOf("/kinetic/"));

function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}
function when(seconds) {
  return seconds ? new Date(seconds * 1000).toISOString().replace("T", " ").slice(0, 19) + "Z" : "";
}
function dur(seconds) {
  if (seconds === null || seconds === undefined) return "";
  const s = Math.round(seconds);
  if (s < 90) return s + "s";
  if (s < 5400) return Math.round(s / 60) + "m";
  return (s / 3600).toFixed(1) + "h";
}
function chipHours(value) {
  return value === null || value === undefined ? "" : Number(value).toFixed(value >= 10 ? 1 : 3);
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
    document.getElementById("runs").innerHTML = data.runs.map((run) => `<tr>
        <td>${esc(run.dag_id)}</td><td>${esc(run.run_id)}</td><td class="num">${run.tasks}</td>
        <td>${Object.entries(run.states).map(([s, n]) => `${badge(s)} ${n}`).join(" ")}</td>
        <td class="num">${run.preemptions}</td><td class="num">${dur(run.run_seconds)}</td>
        <td class="num">${chipHours(run.chip_hours)}</td></tr>`).join("")
      || `<tr><td colspan="7" class="muted">no kinetic jobs match</td></tr>`;
    document.getElementById("jobs").innerHTML = data.jobs.map((row) => `<tr>
        <td>${clip(row.dag_id)}</td><td class="small">${clip(row.run_id)}</td>
        <td>${clip(row.task_id)} ${clip(row.label, "muted")}</td>
        <td>${device(row)}</td><td>${esc(row.backend)}</td>
        <td>${badge(row.state)}<div class="small muted clip lines4" title="${esc(row.doing)}">${esc(row.doing)}</div></td>
        <td class="num">${row.attempts}${row.preemptions ? ` <span class="muted">(${row.preemptions} preempted)</span>` : ""}</td>
        <td class="small">${when(row.started_at)}</td><td class="num">${dur(row.duration_seconds)}</td>
        <td class="num">${chipHours(row.chip_hours)}</td>
        <td class="small">${resultText(row.result)}</td>
        <td class="small links"><a href="${tiPath(row)}" target="_top">log</a> ·
          <a href="${tiPath(row)}/plugin/kinetic-job" target="_top">job</a> · ${outputLink(row.output_dir)}</td></tr>`).join("")
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
    document.getElementById("attempts").innerHTML = row.jobs.slice().reverse().map((job) => `<tr>
        <td class="num">${job.try_number ?? ""}</td><td class="num">${job.attempt ?? ""}</td>
        <td><code>${esc(job.job_id)}</code></td><td>${badge(job.state)}<div class="small muted wrap">${esc(job.doing)}</div></td>
        <td class="small">${when(job.submitted_at)}</td><td class="num">${dur(job.queue_seconds)}</td>
        <td class="num">${dur(job.duration_seconds)}</td><td class="num">${job.chips ?? ""}</td>
        <td class="num">${chipHours(job.chip_hours)}</td></tr>`).join("");
    document.getElementById("history").innerHTML = (row.history || []).slice().reverse().map((h) => `<tr>
        <td class="small">${when(h.time)}</td><td>${badge(h.state)}</td><td>${esc(h.text)}</td></tr>`).join("");
  }
  every(draw);
}
