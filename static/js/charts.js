/* Draws the dashboard's Plotly figures. Each figure is built on the server and embedded with
   Django's json_script (<script type="application/json" id="…">); a
   <div class="plot" data-figure="…"> names the figure it shows. No inline script anywhere, so
   the Content Security Policy can stay at script-src 'self'.

   Dark mode: with prefers-color-scheme: dark, the colours listed in the page's
   "dark-colours" block (billing.charts.DARK) are swapped before drawing, and the charts
   are drawn again when the setting changes. Small screens: no toolbar (it covered legends). */
(function () {
  "use strict";

  var SMALL = window.matchMedia("(max-width: 760px)");
  var DARK = window.matchMedia("(prefers-color-scheme: dark)");

  function config() {
    return {
      displaylogo: false,
      displayModeBar: SMALL.matches ? false : "hover",
      responsive: true,
      modeBarButtonsToRemove: ["lasso2d", "select2d", "sendDataToCloud"],
      toImageButtonOptions: { format: "png", scale: 2 }
    };
  }

  function darkColours() {
    var source = document.getElementById("dark-colours");
    if (!source) { return {}; }
    var map = {};
    var given = JSON.parse(source.textContent);
    Object.keys(given).forEach(function (light) { map[light.toLowerCase()] = given[light]; });
    return map;
  }

  var COLOUR = /#[0-9a-fA-F]{6}\b|rgba\([^)]*\)/g;

  function figure(text, map) {
    // One pass over every colour in the figure: a colour is swapped at most once.
    if (DARK.matches) {
      text = text.replace(COLOUR, function (c) {
        var swapped = map[c.toLowerCase()];
        return swapped === undefined ? c : swapped;
      });
    }
    return JSON.parse(text);
  }

  function draw(el, map) {
    var source = document.getElementById(el.getAttribute("data-figure"));
    if (!source) { return; }
    var fig = figure(source.textContent, map);
    el.setAttribute("data-scheme", DARK.matches ? "dark" : "light");
    window.Plotly.react(el, fig.data, fig.layout, config()).then(function () {
      el.setAttribute("data-drawn", "true");
    });
  }

  function drawAll() {
    var map = darkColours();
    document.querySelectorAll(".plot[data-figure]").forEach(function (el) { draw(el, map); });
  }

  function onChange(query, listener) {
    if (query.addEventListener) { query.addEventListener("change", listener); }
    else if (query.addListener) { query.addListener(listener); }
  }

  function breakevenForm() {
    var form = document.getElementById("breakeven-form");
    if (!form) { return; }
    var mode = form.querySelector("[name=price_mode]");
    if (!mode) { return; }
    function sync() {
      var blended = mode.value === "blended";
      form.querySelectorAll(".f-api_price_per_mtok").forEach(function (n) { n.hidden = !blended; });
      form.querySelectorAll(".f-api_input_price_per_mtok, .f-api_output_price_per_mtok, .f-output_share")
        .forEach(function (n) { n.hidden = blended; });
    }
    mode.addEventListener("change", sync);
    sync();
  }

  function filters() {
    // Changing a select applies the filter at once; dates wait for the Apply button.
    var form = document.getElementById("filters");
    if (!form) { return; }
    form.querySelectorAll("select").forEach(function (sel) {
      sel.addEventListener("change", function () { form.submit(); });
    });
  }

  function start() {
    drawAll();
    onChange(DARK, drawAll);
    onChange(SMALL, drawAll);
    breakevenForm();
    filters();
    document.body.setAttribute("data-charts-ready", "true");
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
