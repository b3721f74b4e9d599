// Side-by-side completions: one pane per output (DEFAULT, STEERED, sweep rows x-2, x4, ...).
// Only steered panes mark where they split from DEFAULT. Hovering a token shows its
// probability and the top alternatives in the shared hover box (tip.js). Runs from the
// widget's saved state, so a static HTML export still shows it.
const STOPS = { length: "hit token limit", eos: "ended", cancelled: "stopped" };

function title(label) {
  return label.startsWith("STEERED*") ? `STEERED x${label.slice(8)}` : label;
}

function state(p) {
  const bits = [];
  if (p.stop) bits.push(STOPS[p.stop] || p.stop);
  else if (p.streaming) bits.push("generating…");
  if (p.label !== "DEFAULT" && p.tokens.length) {
    if (p.diverge > 0) bits.push(`same as DEFAULT for ${p.diverge} tokens, then splits`);
    else if (p.diverge === 0) bits.push("differs from DEFAULT from the first token");
    else if (p.stop) bits.push("same as DEFAULT");
  }
  return bits.join(" · ");
}

function pct(q) {
  return q >= 0.001 ? `${(100 * q).toFixed(1)}%` : `${(100 * q).toExponential(1)}%`;
}

function describe(p, i) {
  const token = JSON.stringify(p.tokens[i]);
  const probs = p.probs && p.probs[i];
  if (!probs) return `${token}\nprobabilities not available`;
  const [prob, top] = probs;
  const alts = top.map(([t, q]) => `  ${JSON.stringify(t)}  ${pct(q)}${t === p.tokens[i] ? "  (chosen)" : ""}`);
  return `${token}  probability ${pct(prob)}\nalternatives:\n${alts.join("\n")}`;
}

function pane(p, hover) {
  const box = document.createElement("div");
  box.className = "sw-pane";
  box.dataset.label = p.label;
  box.dataset.stop = p.stop || "";
  const head = document.createElement("div");
  head.className = "sw-head";
  const name = document.createElement("span");
  name.textContent = title(p.label);
  const st = document.createElement("span");
  st.className = "sw-state";
  st.textContent = state(p);
  head.append(name, st);
  const body = document.createElement("div");
  body.className = "sw-text";
  if (!p.tokens.length && p.note) {
    body.classList.add("sw-empty");
    body.textContent = p.note;
  }
  const split = p.label !== "DEFAULT" ? p.diverge : -1;
  p.tokens.forEach((t, i) => {
    const span = document.createElement("span");
    span.textContent = t;
    const cls = [];
    if (p.special && p.special[i]) cls.push("sw-special");
    if (split >= 0 && i >= split) cls.push(i === split ? "sw-split-first" : "sw-split");
    if (cls.length) span.className = cls.join(" ");
    hover.attach(span, () => describe(p, i));
    body.appendChild(span);
  });
  box.append(head, body);
  return box;
}

function render({ model, el }) {
  el.classList.add("sw-completions");
  const note = document.createElement("div");
  note.className = "sw-stale-note";
  const prompt = document.createElement("div");
  prompt.className = "sw-prompt sw-text";
  const grid = document.createElement("div");
  grid.className = "sw-grid";
  el.append(note, prompt, grid);
  const hover = hoverBox(el);
  const draw = () => {
    const stale = model.get("stale");
    el.classList.toggle("sw-stale", !!stale);
    note.textContent = stale ? `stale: ${stale}` : "";
    const text = model.get("prompt");
    prompt.textContent = text ? `prompt: ${text}` : "";
    hover.hide();
    grid.replaceChildren(...model.get("panes").map((p) => pane(p, hover)));
  };
  for (const name of ["panes", "prompt", "stale"]) model.on(`change:${name}`, draw);
  draw();
}

export default { render };
