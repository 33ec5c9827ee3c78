/* Draws the dashboard's Plotly figures. Each figure is built on the server and embedded with
   Django's json_script (<script type="application/json" id="…">); a
   <div class="plot" data-figure="…"> names the figure it shows. No inline script anywhere, so
   the Content Security Policy can stay at script-src 'self'. */
(function () {
  "use strict";

  var CONFIG = {
    displaylogo: false,
    responsive: true,
    modeBarButtonsToRemove: ["lasso2d", "select2d", "sendDataToCloud"],
    toImageButtonOptions: { format: "png", scale: 2 }
  };

  function draw(el) {
    var source = document.getElementById(el.getAttribute("data-figure"));
    if (!source) { return; }
    var fig = JSON.parse(source.textContent);
    window.Plotly.newPlot(el, fig.data, fig.layout, CONFIG).then(function () {
      el.setAttribute("data-drawn", "true");
    });
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
    document.querySelectorAll(".plot[data-figure]").forEach(draw);
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
