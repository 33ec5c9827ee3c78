/* Everything visible on the page that breaks the layout, as sentences: sideways scrolling,
   boxes wider than the viewport, text that does not fit its box, boxes that overlap their
   siblings. Run by tests/e2e/test_first_minutes_browser.py with page.evaluate. */
() => {
  const W = document.documentElement.clientWidth;
  const out = [];
  const visible = el => {
    const r = el.getBoundingClientRect(), s = getComputedStyle(el);
    return r.width > 0 && r.height > 0 && s.visibility !== "hidden" && s.display !== "none";
  };
  const name = el => el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") +
    (el.className && typeof el.className === "string" ? "." + el.className.trim().split(/\s+/).join(".") : "") +
    " \"" + (el.textContent || "").trim().slice(0, 40) + "\"";
  const scrollsInside = el => {
    for (let p = el.parentElement; p; p = p.parentElement) {
      const ox = getComputedStyle(p).overflowX;
      if (ox === "auto" || ox === "scroll" || ox === "hidden" || ox === "clip") return true;
    }
    return false;
  };
  if (document.documentElement.scrollWidth > W + 1) {
    out.push("the page scrolls sideways: " + document.documentElement.scrollWidth + " > " + W);
  }
  for (const el of document.querySelectorAll("body *")) {
    if (el.closest(".plot") && !el.matches(".plot")) continue;  // plotly's own drawing
    if (el.closest("#js-plotly-tester")) continue;  // plotly measures text off-screen
    if (el.closest("details:not([open]) > ul")) continue;
    if (!visible(el)) continue;
    const r = el.getBoundingClientRect();
    if ((r.right > W + 1 || r.left < -1) && !scrollsInside(el)) {
      out.push("wider than the viewport: " + name(el) + " " + Math.round(r.left) + "–" + Math.round(r.right));
    }
  }
  const texts = "h1, h2, h3, p, td, th, label, button, summary, figcaption, li, dd, dt, " +
    ".presets a, .mainnav a, .usermenu a, .kpi .value";
  for (const el of document.querySelectorAll(texts)) {
    if (!visible(el) || getComputedStyle(el).display === "inline") continue;
    if (el.scrollWidth > el.clientWidth + 1) {
      out.push("text does not fit: " + name(el) + " " + el.scrollWidth + " > " + el.clientWidth);
    }
  }
  const overlap = (a, b) => {
    const p = a.getBoundingClientRect(), q = b.getBoundingClientRect();
    return p.left < q.right - 1 && q.left < p.right - 1 && p.top < q.bottom - 1 && q.top < p.bottom - 1;
  };
  const groups = [".kpi", ".kpi > *", ".presets a", ".filters > label, .filters > button, .filters > .range-note, .filters > .presets",
    ".mainnav a", ".topbar > a, .topbar > button, .site-menu > *", ".grid2 > .chart", ".block-figures li",
    ".cards-on-small tbody tr", "tr > td", ".facts > div", ".errorpage > *", ".pagehead > *"];
  for (const sel of groups) {
    const els = [...document.querySelectorAll(sel)].filter(visible);
    for (let i = 0; i < els.length; i++) {
      for (let j = i + 1; j < els.length; j++) {
        if (els[i].parentElement === els[j].parentElement && overlap(els[i], els[j])) {
          out.push("overlap: " + name(els[i]) + " and " + name(els[j]));
        }
      }
    }
  }
  return out;
}
