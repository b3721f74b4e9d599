// Side-by-side completions: one pane per output (DEFAULT, STEERED, sweep rows).
// Runs in the browser from the widget's saved state, so a static HTML export still shows it.
const STYLE = `
.sw-completions { font-family: var(--jp-content-font-family, sans-serif); }
.sw-completions .sw-grid { display: grid; grid-template-columns: repeat(2, minmax(0, 1fr)); gap: 8px; }
.sw-completions .sw-pane { border: 1px solid rgba(128,128,128,0.4); border-radius: 4px; padding: 6px; min-height: 3em; }
.sw-completions .sw-head { font-weight: 600; font-size: 0.85em; margin-bottom: 4px; opacity: 0.85; }
.sw-completions .sw-prompt { opacity: 0.6; }
.sw-completions .sw-text { white-space: pre-wrap; word-break: break-word; line-height: 1.45; }
.sw-completions .sw-div { background: rgba(255, 165, 0, 0.22); }
.sw-completions .sw-div-first { background: rgba(255, 120, 0, 0.55); outline: 1px solid rgba(255,120,0,0.9); }
.sw-completions .sw-special { opacity: 0.45; font-size: 0.8em; }
.sw-completions .sw-empty { opacity: 0.5; font-style: italic; }
`;

function pane(p) {
  const box = document.createElement("div");
  box.className = "sw-pane";
  box.dataset.label = p.label;
  const head = document.createElement("div");
  head.className = "sw-head";
  let state = p.stop ? ` (${p.stop})` : p.streaming ? " …" : "";
  if (p.diverge >= 0) state += ` · departs at token ${p.diverge}`;
  head.textContent = p.label + state;
  const body = document.createElement("div");
  body.className = "sw-text";
  if (!p.tokens.length && p.note) {
    body.classList.add("sw-empty");
    body.textContent = p.note;
  }
  p.tokens.forEach((t, i) => {
    const span = document.createElement("span");
    span.textContent = t;
    const cls = [];
    if (p.special && p.special[i]) cls.push("sw-special");
    if (p.diverge >= 0 && i >= p.diverge) cls.push(i === p.diverge ? "sw-div-first" : "sw-div");
    if (cls.length) span.className = cls.join(" ");
    body.appendChild(span);
  });
  box.append(head, body);
  return box;
}

function render({ model, el }) {
  el.classList.add("sw-completions");
  const style = document.createElement("style");
  style.textContent = STYLE;
  const prompt = document.createElement("div");
  prompt.className = "sw-prompt sw-text";
  const grid = document.createElement("div");
  grid.className = "sw-grid";
  el.append(style, prompt, grid);
  const draw = () => {
    prompt.textContent = model.get("prompt");
    grid.replaceChildren(...model.get("panes").map(pane));
  };
  model.on("change:panes", draw);
  model.on("change:prompt", draw);
  draw();
}

export default { render };
