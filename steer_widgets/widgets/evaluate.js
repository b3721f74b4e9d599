// The evaluate panel: prompt list and ladder, progress, the trade-off chart (SVG from the
// kernel) and a prompts x strengths grid coloured by hit. It draws from widget state only, so
// a saved notebook or a static export shows the last evaluation with no kernel; clicks go
// back to the kernel as messages (evaluate, stop, pick a strength).
function render({ model, el }) {
  el.classList.add("sw-eval");
  const bar = document.createElement("div");
  bar.className = "sw-eval-bar";
  const run = document.createElement("button");
  run.textContent = "evaluate";
  run.className = "sw-eval-run";
  run.title = "run the current steering over the prompts and the strength ladder";
  const stop = document.createElement("button");
  stop.textContent = "cancel";
  stop.title = "cancel the evaluation (finished rows stay)";
  stop.className = "sw-eval-stop";
  const badge = document.createElement("span");
  badge.className = "sw-badge";
  const progress = document.createElement("progress");
  const message = document.createElement("span");
  message.className = "sw-message";
  bar.append(run, stop, badge, progress, message);
  const error = document.createElement("div");
  error.className = "sw-error";
  const inputs = document.createElement("details");
  const summary = document.createElement("summary");
  summary.textContent = "prompts and strengths";
  const prompts = document.createElement("textarea");
  prompts.rows = 6;
  prompts.className = "sw-eval-prompts";
  prompts.title = "one prompt per line; a line starting with 'chat:' is a chat request. " +
    "A prompt given from Python (⏎: its line breaks; a chat: its messages) runs as given " +
    "while its line is left unchanged";
  const ladder = document.createElement("input");
  ladder.className = "sw-eval-ladder";
  ladder.title = "strength multipliers of the current steering (x1: the sliders as they are)";
  inputs.append(summary, prompts, ladder);
  const chart = document.createElement("div");
  chart.className = "sw-eval-chart";
  const table = document.createElement("table");
  table.className = "sw-eval-grid";
  el.append(bar, error, inputs, chart, table);

  const send = (event, extra = {}) => model.send({ event, ...extra });
  run.onclick = () => send("evaluate");
  stop.onclick = () => send("stop");
  prompts.onchange = () => { model.set("prompts_text", prompts.value); model.save_changes(); };
  ladder.onchange = () => { model.set("ladder_text", ladder.value); model.save_changes(); };
  const pick = (strength) => send("pick", { strength });

  const drawChart = () => {
    chart.innerHTML = model.get("svg");
    for (const point of chart.querySelectorAll(".sw-point")) {
      point.addEventListener("click", () => pick(Number(point.dataset.strength)));
    }
  };
  const drawGrid = () => {
    table.replaceChildren();
    const strengths = model.get("strengths");
    const rows = model.get("grid");
    if (!rows.length) return;
    const head = table.insertRow();
    head.insertCell().textContent = "prompt";
    const best = model.get("best");
    for (const m of strengths) {
      const th = head.insertCell();
      th.textContent = `x${m}`;
      th.className = "sw-eval-strength" + (m === best ? " sw-eval-best" : "");
      th.title = "set the sliders to this strength";
      th.dataset.strength = m;
      th.onclick = () => pick(m);
    }
    for (const row of rows) {
      const tr = table.insertRow();
      const name = tr.insertCell();
      name.className = "sw-eval-prompt";
      name.textContent = `${row.kind === "chat" ? "chat: " : ""}${row.prompt}`;
      name.title = `DEFAULT: ${row.default}`;
      for (const cell of row.cells) {
        const td = tr.insertCell();
        td.className = "sw-eval-cell";
        if (!cell) { td.classList.add("sw-eval-pending"); td.textContent = "…"; continue; }
        if (cell.running) {
          td.classList.add("sw-eval-running");
          td.textContent = "…";
          td.title = `decoding: ${cell.text}`;
          continue;
        }
        td.classList.add(cell.success ? "sw-eval-hit" : "sw-eval-miss");
        td.textContent = cell.success ? "✓" : "·";
        const flu = cell.fluency_delta >= 0 ? `+${cell.fluency_delta}` : `${cell.fluency_delta}`;
        td.title = `x${cell.strength}: ${cell.success ? "turned" : "did not turn"} ` +
          `(fluency ${flu} nat)\n${cell.text}`;
        td.dataset.strength = cell.strength;
      }
    }
  };
  const draw = () => {
    const state = model.get("state");
    el.dataset.state = state;
    badge.textContent = model.get("label");
    message.textContent = model.get("message");
    const err = model.get("error");
    error.textContent = err ? `error: ${err}` : "";
    error.hidden = !err;
    const total = model.get("total_rows");
    progress.max = Math.max(1, total);
    progress.value = model.get("done_rows");
    progress.hidden = !total;
    stop.disabled = state !== "running";
    if (document.activeElement !== prompts) prompts.value = model.get("prompts_text");
    if (document.activeElement !== ladder) ladder.value = model.get("ladder_text");
  };
  for (const name of ["state", "label", "message", "error", "done_rows", "total_rows",
    "prompts_text", "ladder_text"]) model.on(`change:${name}`, draw);
  model.on("change:svg", drawChart);
  model.on("change:grid", drawGrid);
  model.on("change:best", drawGrid);
  draw();
  drawChart();
  drawGrid();
}

export default { render };
