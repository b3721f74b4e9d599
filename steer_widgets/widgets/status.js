// The explorer's status line: a state badge, the message, the error, and cache statistics
// behind a details toggle. Everything comes from the widget state (no kernel needed).
function render({ model, el }) {
  el.classList.add("sw-status");
  const badge = document.createElement("span");
  badge.className = "sw-badge";
  const message = document.createElement("span");
  message.className = "sw-message";
  const error = document.createElement("div");
  error.className = "sw-error";
  const details = document.createElement("details");
  const summary = document.createElement("summary");
  summary.textContent = "cache statistics";
  const stats = document.createElement("pre");
  details.append(summary, stats);
  el.append(badge, message, error, details);
  const draw = () => {
    const state = model.get("state");
    el.dataset.state = state;
    badge.textContent = model.get("label");
    message.textContent = model.get("message");
    const err = model.get("error");
    error.textContent = err ? `error: ${err}` : "";
    error.hidden = !err;
    stats.textContent = model.get("details");
    details.hidden = !model.get("details");
  };
  for (const name of ["state", "label", "message", "error", "details"]) model.on(`change:${name}`, draw);
  draw();
}

export default { render };
