/* An element's text and background luminance (WCAG) and their contrast ratio; the
   background is the first opaque one up the tree. */
(el) => {
  const parse = c => c.match(/[\d.]+/g).slice(0, 3).map(Number);
  const lum = rgb => {
    const [r, g, b] = rgb.map(v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  let bgEl = el, bg = "rgba(0, 0, 0, 0)";
  while (bgEl && (bg === "rgba(0, 0, 0, 0)" || bg === "transparent")) {
    bg = getComputedStyle(bgEl).backgroundColor; bgEl = bgEl.parentElement;
  }
  const fg = lum(parse(getComputedStyle(el).color)), back = lum(parse(bg));
  return {fg: fg, bg: back, contrast: (Math.max(fg, back) + 0.05) / (Math.min(fg, back) + 0.05)};
}
