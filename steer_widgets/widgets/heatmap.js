// Activation heatmap: tokens colored by one feature's activation. Hover a token for its value
// and top features; click it to pin that information below. Everything it needs is in the
// widget state, so it also renders in a static HTML export without a kernel.
const STYLE = `
.sw-heatmap { font-family: var(--jp-content-font-family, sans-serif); }
.sw-heatmap .sw-title { font-weight: 600; font-size: 0.85em; margin-bottom: 4px; }
.sw-heatmap .sw-row { display: flex; gap: 8px; margin: 2px 0; align-items: baseline; }
.sw-heatmap .sw-label { flex: 0 0 5.5em; font-size: 0.8em; opacity: 0.75; }
.sw-heatmap .sw-toks { white-space: pre-wrap; word-break: break-word; line-height: 1.6; }
.sw-heatmap .sw-tok { cursor: pointer; border-radius: 2px; }
.sw-heatmap .sw-tok:hover { outline: 1px solid rgba(128,128,128,0.8); }
.sw-heatmap .sw-tok.sw-sel { outline: 2px solid rgba(30,120,255,0.9); }
.sw-heatmap .sw-special { opacity: 0.45; font-size: 0.8em; }
.sw-heatmap .sw-info { font-size: 0.85em; margin-top: 4px; min-height: 1.2em; font-family: var(--jp-code-font-family, monospace); }
`;

function describe(row, i) {
  const v = row.values[i] ?? 0;
  let s = `${JSON.stringify(row.tokens[i])}  value ${v.toFixed(3)}`;
  const top = (row.top && row.top[i]) || [];
  if (top.length) s += "  · top: " + top.map(([f, a]) => `#${f} ${a.toFixed(2)}`).join(", ");
  return s;
}

function render({ model, el }) {
  el.classList.add("sw-heatmap");
  const style = document.createElement("style");
  style.textContent = STYLE;
  const title = document.createElement("div");
  title.className = "sw-title";
  const rowsEl = document.createElement("div");
  const info = document.createElement("div");
  info.className = "sw-info";
  el.append(style, title, rowsEl, info);

  const draw = () => {
    const rows = model.get("rows");
    const max = model.get("max_value") || 0;
    const [selRow, selPos] = model.get("selected");
    title.textContent = model.get("title");
    rowsEl.replaceChildren();
    rows.forEach((row, r) => {
      const line = document.createElement("div");
      line.className = "sw-row";
      line.dataset.label = row.label;
      const label = document.createElement("div");
      label.className = "sw-label";
      label.textContent = row.label;
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
        span.title = describe(row, i);
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
  for (const name of ["rows", "max_value", "title", "selected"]) model.on(`change:${name}`, draw);
  draw();
}

export default { render };
