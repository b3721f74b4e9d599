// Activation heatmap: tokens colored by one feature's activation. Hovering a token shows its
// value and top features in a tooltip drawn by the widget; clicking pins that information
// below. Everything it needs is in the widget state, so a static HTML export shows it too.
function describe(row, i) {
  const v = row.values[i] ?? 0;
  let s = `${JSON.stringify(row.tokens[i])}  value ${v.toFixed(3)}`;
  const top = (row.top && row.top[i]) || [];
  if (top.length) s += "\ntop features: " + top.map(([f, a]) => `#${f} ${a.toFixed(2)}`).join(", ");
  return s;
}

function render({ model, el }) {
  el.classList.add("sw-heatmap");
  const title = document.createElement("div");
  title.className = "sw-title";
  const rowsEl = document.createElement("div");
  rowsEl.className = "sw-rows";
  const info = document.createElement("div");
  info.className = "sw-info";
  el.append(title, rowsEl, info);
  const box = hoverBox(el);

  const draw = () => {
    const rows = model.get("rows");
    const max = model.get("max_value") || 0;
    const [selRow, selPos] = model.get("selected");
    const stale = model.get("stale");
    el.classList.toggle("sw-stale", !!stale);
    title.textContent = model.get("title") + (stale ? ` (stale: ${stale})` : "");
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
  for (const name of ["rows", "max_value", "title", "selected", "stale"]) model.on(`change:${name}`, draw);
  draw();
}

export default { render };
