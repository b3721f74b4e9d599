// The in-widget hover box shared by the panes and the heatmap (never the browser's native
// title tooltip). Prepended to each widget's module by ``assets.py``, so every widget stays
// one self-contained ES module. ``attach(span, text)`` shows ``text()`` below ``span``.
function hoverBox(el) {
  const tip = document.createElement("div");
  tip.className = "sw-tip";
  tip.hidden = true;
  el.appendChild(tip);
  const attach = (span, text) => {
    span.addEventListener("mouseenter", () => {
      tip.textContent = text();
      tip.hidden = false;
      const box = el.getBoundingClientRect();
      const r = span.getBoundingClientRect();
      const left = Math.max(0, Math.min(r.left - box.left, box.width - tip.offsetWidth));
      tip.style.left = `${left}px`;
      tip.style.top = `${r.bottom - box.top + 4}px`;
    });
    span.addEventListener("mouseleave", () => { tip.hidden = true; });
  };
  return { tip, attach, hide: () => { tip.hidden = true; } };
}

