// Side-by-side completions: one pane per output (DEFAULT, STEERED, sweep rows x-2, x4, ...).
// Only steered panes mark where they split from DEFAULT. Hovering a token shows its
// probability and the top alternatives in the shared hover box (tip.js). "colour by steering
// effect" paints steered tokens green where steering raised them and purple where it lowered
// them (not the heatmap's orange nor the split's blue); clicking a token asks the kernel for
// its attribution table. Runs from the widget's saved state, so a static HTML export still
// shows it.
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

const EFFECT_SCALE = 4; // nats at full colour

function effectLine(u, s) {
  if (Math.abs(s - u) < 5e-4 * Math.max(s, u, 1e-12)) return `steering left this token at ${pct(s)}`;
  return `steering ${s > u ? "raised" : "lowered"} this token from ${pct(u)} to ${pct(s)}`;
}

function describe(p, i, eff) {
  const token = JSON.stringify(p.tokens[i]);
  const lead = eff ? `${effectLine(eff.p_unsteered[i], eff.p_steered[i])}\n` : "";
  const probs = p.probs && p.probs[i];
  if (!probs) return `${lead}${token}\nprobabilities not available`;
  const [prob, top] = probs;
  const alts = top.map(([t, q]) => `  ${JSON.stringify(t)}  ${pct(q)}${t === p.tokens[i] ? "  (chosen)" : ""}`);
  return `${lead}${token}  probability ${pct(prob)}\nalternatives:\n${alts.join("\n")}`;
}

function effectColour(e) {
  const a = Math.min(1, Math.abs(e) / EFFECT_SCALE);
  if (a < 0.02) return "";
  const rgb = e > 0 ? "0, 150, 80" : "150, 60, 200";
  return `rgba(${rgb}, ${(0.1 + 0.6 * a).toFixed(3)})`;
}

function fmt(x) {
  return x === null || x === undefined ? "" : Number(x).toFixed(3);
}

function action(model, name, f) {
  const b = document.createElement("button");
  b.className = `sw-att-${name}`;
  b.textContent = name;
  b.addEventListener("click", () => {
    model.set("feature_action", { action: name, source: f.source, index: f.index, at: Date.now() });
    model.save_changes();
  });
  return b;
}

function table(att, model) {
  const box = document.createElement("div");
  box.className = "sw-attribution";
  if (!att || !att.label) return box;
  const head = document.createElement("div");
  head.className = "sw-att-head";
  head.textContent = att.error
    ? att.error
    : `why ${JSON.stringify(att.token)} (${att.label}, token ${att.position}): log-probability +${fmt(att.gain)} nats from steering (${att.method})`;
  box.appendChild(head);
  if (att.error) return box;
  const t = document.createElement("table");
  const hr = t.insertRow();
  for (const h of ["", "name", "share (nats)", "measured", "before", "after", ""]) {
    const th = document.createElement("th");
    th.textContent = h;
    hr.appendChild(th);
  }
  for (const r of att.rows) {
    const tr = t.insertRow();
    tr.className = "sw-att-row";
    for (const v of ["row", r.name, fmt(r.attribution), fmt(r.removed), "", ""]) tr.insertCell().textContent = v;
  }
  for (const f of att.features) {
    const tr = t.insertRow();
    tr.className = "sw-att-feature";
    const cells = ["feature", `${f.source} #${f.index} ${f.label}`, fmt(f.attribution), fmt(f.ablated), fmt(f.before), fmt(f.after)];
    for (const v of cells) tr.insertCell().textContent = v;
    tr.insertCell().append(action(model, "card", f), action(model, "steer", f));
  }
  box.appendChild(t);
  return box;
}

function pane(p, hover, model) {
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
  const eff = model.get("effect_on") ? (model.get("effects") || {})[p.label] : null;
  const sel = model.get("selected") || {};
  p.tokens.forEach((t, i) => {
    const span = document.createElement("span");
    span.textContent = t;
    const cls = [];
    if (p.special && p.special[i]) cls.push("sw-special");
    if (split >= 0 && i >= split) cls.push(i === split ? "sw-split-first" : "sw-split");
    if (sel.label === p.label && sel.position === i) cls.push("sw-picked");
    if (p.gated && p.gated[i]) cls.push("sw-gated");
    if (cls.length) span.className = cls.join(" ");
    const shown = eff && i < eff.effect.length ? eff : null;
    if (shown) {
      span.dataset.effect = String(shown.effect[i]);
      const bg = effectColour(shown.effect[i]);
      if (bg) span.style.background = bg;
    }
    hover.attach(span, () => describe(p, i, shown));
    if (p.label !== "DEFAULT") {
      span.addEventListener("click", () => {
        model.set("selected", { label: p.label, position: i });
        model.save_changes();
      });
    }
    body.appendChild(span);
  });
  box.append(head, body);
  if (p.gated) {
    const legend = document.createElement("div");
    legend.className = "sw-gate-legend";
    const on = p.gated.filter(Boolean).length;
    legend.textContent = `▁ written while its condition held (${on} of ${p.gated.length} tokens)`;
    box.append(legend);
  }
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
  const toggle = document.createElement("label");
  toggle.className = "sw-effect-toggle";
  const check = document.createElement("input");
  check.type = "checkbox";
  check.addEventListener("change", () => {
    model.set("effect_on", check.checked);
    model.save_changes();
  });
  toggle.append(check, " colour by steering effect (green raised, purple lowered; click a token: why)");
  const att = document.createElement("div");
  el.append(note, toggle, prompt, grid, att);
  const hover = hoverBox(el);
  const draw = () => {
    const stale = model.get("stale");
    el.classList.toggle("sw-stale", !!stale);
    note.textContent = stale ? `stale: ${stale}` : "";
    const text = model.get("prompt");
    prompt.textContent = text ? `prompt: ${text}` : "";
    hover.hide();
    check.checked = !!model.get("effect_on");
    grid.replaceChildren(...model.get("panes").map((p) => pane(p, hover, model)));
    att.replaceChildren(table(model.get("attribution"), model));
  };
  for (const name of ["panes", "prompt", "stale", "effect_on", "effects", "selected", "attribution"]) {
    model.on(`change:${name}`, draw);
  }
  draw();
}

export default { render };
