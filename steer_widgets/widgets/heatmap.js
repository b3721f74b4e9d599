// Activation heatmap: tokens colored by one feature's activation. Hovering a token shows its
// value and top features in a tooltip drawn by the widget; clicking pins that information
// below. Beside it, "what changed": the features the steering moved most; clicking one shows
// it in the heatmap. Everything it needs is in the widget state, so a static HTML export
// shows it too.
function describe(row, i) {
  const v = row.values[i] ?? 0;
  let s = `${JSON.stringify(row.tokens[i])}  value ${v.toFixed(3)}`;
  const top = (row.top && row.top[i]) || [];
  if (top.length) s += "\ntop features: " + top.map(([f, a]) => `#${f} ${a.toFixed(2)}`).join(", ");
  return s;
}

// The colour scale from 0 to the peak with a line at each of a condition's bounds, and its
// legend: a token is outlined where it passes them (> above and < below), as its gate would.
function scale(max, [above, below]) {
  const box = document.createElement("span");
  box.className = "sw-scale-box";
  const bar = document.createElement("span");
  bar.className = "sw-scale";
  for (const thr of [above, below]) {
    if (thr === null || thr === undefined) continue;
    const line = document.createElement("span");
    line.className = "sw-threshold";
    const at = max > 0 ? Math.max(0, Math.min(1, thr / max)) : 0;
    line.style.left = `${(100 * at).toFixed(1)}%`;
    bar.append(line);
  }
  const parts = [];
  if (above !== null && above !== undefined) parts.push(`> ${above.toFixed(3)}`);
  if (below !== null && below !== undefined) parts.push(`< ${below.toFixed(3)}`);
  box.append(bar, ` outlined tokens score ${parts.join(" and ")}`);
  return box;
}

function passes(v, [above, below]) {
  return (above === null || above === undefined || v > above) && (below === null || below === undefined || v < below);
}

function render({ model, el }) {
  el.classList.add("sw-heatmap");
  const title = document.createElement("div");
  title.className = "sw-title";
  const rowsEl = document.createElement("div");
  rowsEl.className = "sw-rows";
  const info = document.createElement("div");
  info.className = "sw-info";
  const main = document.createElement("div");
  main.className = "sw-heat-main";
  main.append(title, rowsEl, info);
  const side = document.createElement("div");
  side.className = "sw-changed";
  el.append(main, side);
  const box = hoverBox(el);

  const drawChanged = () => {
    const rows = model.get("changed") || [];
    side.hidden = !rows.length;
    const head = document.createElement("div");
    head.className = "sw-title";
    head.textContent = model.get("changed_title") || "what changed";
    const list = document.createElement("ol");
    const picked = model.get("picked") || {};
    for (const f of rows) {
      const li = document.createElement("li");
      li.className = "sw-changed-row";
      if (picked.source === f.source && picked.index === f.index) li.classList.add("sw-sel");
      const sign = f.change >= 0 ? "+" : "";
      li.textContent = `#${f.index} ${f.label}  ${sign}${f.change.toFixed(2)} (${f.default.toFixed(2)} → ${f.steered.toFixed(2)})`;
      li.addEventListener("click", () => {
        model.set("picked", { source: f.source, index: f.index });
        model.save_changes();
      });
      list.appendChild(li);
    }
    side.replaceChildren(head, list);
  };

  const draw = () => {
    const rows = model.get("rows");
    const max = model.get("max_value") || 0;
    const [selRow, selPos] = model.get("selected");
    const stale = model.get("stale");
    el.classList.toggle("sw-stale", !!stale);
    title.textContent = model.get("title") + (stale ? ` (stale: ${stale})` : "");
    const bounds = model.get("bounds") || [null, null];
    const marked = bounds.some((b) => b !== null && b !== undefined);
    if (marked) title.append(scale(max, bounds));
    rowsEl.replaceChildren();
    box.hide();
    rows.forEach((row, r) => {
      const line = document.createElement("div");
      line.className = "sw-row";
      line.dataset.label = row.label;
      const label = document.createElement("div");
      label.className = "sw-label";
      label.textContent = row.label.startsWith("STEERED*") ? `STEERED x${row.label.slice(8)}` : row.label;
      const toks = document.createElement("div");
      toks.className = "sw-toks";
      row.tokens.forEach((t, i) => {
        const span = document.createElement("span");
        span.className = "sw-tok";
        if (row.special && row.special[i]) span.classList.add("sw-special");
        if (r === selRow && i === selPos) span.classList.add("sw-sel");
        span.textContent = t;
        const v = row.values[i] ?? 0;
        span.dataset.value = String(v);
        const a = max > 0 ? Math.max(0, Math.min(1, v / max)) : 0;
        if (a > 0) span.style.background = `rgba(255, 110, 0, ${(0.1 + 0.8 * a).toFixed(3)})`;
        if (marked && passes(v, bounds)) span.classList.add("sw-over");
        box.attach(span, () => describe(row, i));
        span.addEventListener("click", () => {
          model.set("selected", [r, i]);
          model.save_changes();
        });
        toks.appendChild(span);
      });
      line.append(label, toks);
      rowsEl.appendChild(line);
    });
    const row = rows[selRow];
    info.textContent = row && selPos >= 0 && selPos < row.tokens.length ? describe(row, selPos) : "";
  };
  for (const name of ["rows", "max_value", "title", "selected", "stale", "bounds"]) model.on(`change:${name}`, draw);
  for (const name of ["changed", "changed_title", "picked"]) model.on(`change:${name}`, drawChanged);
  draw();
  drawChanged();
}

export default { render };
