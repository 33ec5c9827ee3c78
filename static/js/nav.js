/* The navigation on small screens: the "Menu" button opens and closes the page list and the
   user menu. Without this script (or on wide screens) they are simply shown. */
(function () {
  "use strict";
  document.documentElement.classList.add("js");

  function start() {
    var button = document.querySelector(".menu-toggle");
    var menu = document.getElementById("site-menu");
    if (!button || !menu) { return; }
    button.addEventListener("click", function () {
      var open = button.getAttribute("aria-expanded") !== "true";
      button.setAttribute("aria-expanded", open ? "true" : "false");
      document.body.classList.toggle("menu-open", open);
    });
    document.addEventListener("keydown", function (e) {
      if (e.key === "Escape" && document.body.classList.contains("menu-open")) {
        button.setAttribute("aria-expanded", "false");
        document.body.classList.remove("menu-open");
        button.focus();
      }
    });
  }

  /* Parts of a page that take longer than the rest (the overview's workloads panel): an
     element with data-fragment="URL" is replaced by the HTML that URL answers, once the page
     has loaded. Without this script a link to the full page stands in its place. */
  function fragments() {
    document.querySelectorAll("[data-fragment]").forEach(function (slot) {
      fetch(slot.getAttribute("data-fragment"), {credentials: "same-origin"})
        .then(function (r) { return r.ok ? r.text() : ""; })
        .then(function (html) { slot.outerHTML = html; })
        .catch(function () { slot.remove(); });
    });
  }

  function ready() {
    start();
    fragments();
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", ready);
  } else {
    ready();
  }
})();
