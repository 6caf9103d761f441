/* Effect Ledger console: live countdowns and visible htmx failures. No dependencies but htmx. */
(function () {
  "use strict";

  function fmt(seconds) {
    if (seconds <= 0) return "expired";
    var s = Math.floor(seconds), m = Math.floor(s / 60), h = Math.floor(m / 60);
    if (s < 60) return s + " s";
    if (m < 60) return m + " min " + (s % 60) + " s";
    return h + " h " + (m % 60) + " min";
  }

  function tick() {
    var now = Date.now();
    document.querySelectorAll("time.countdown[datetime]").forEach(function (el) {
      var left = (Date.parse(el.getAttribute("datetime")) - now) / 1000;
      el.textContent = fmt(left);
      el.classList.toggle("expired", left <= 0);
      el.classList.toggle("soon", left > 0 && left < 120);
    });
  }
  setInterval(tick, 1000);
  document.addEventListener("DOMContentLoaded", tick);

  function notice(text) {
    var box = document.getElementById("notice");
    if (!box) return;
    box.textContent = text;
    box.hidden = false;
  }

  function clearNotice() {
    var box = document.getElementById("notice");
    if (box) { box.hidden = true; box.textContent = ""; }
  }

  // A region whose refresh failed keeps what it showed last, which may no longer be true
  // ("No intent is UNKNOWN." while intents went UNKNOWN). Mark it stale where the user looks:
  // a line at its top, its empty-state text (.empty) and live indicators (.refreshing) hidden,
  // the rest dimmed (console.css). The next successful swap replaces or clears the mark.
  function markStale(region, why) {
    if (!region || !region.isConnected) return;
    region.classList.add("stale");
    var mark = region.querySelector(":scope > .stale-mark");
    if (!mark) {
      mark = document.createElement("p");
      mark.className = "stale-mark";
      mark.setAttribute("role", "status");
      region.insertBefore(mark, region.firstChild);
    }
    mark.textContent = "Not refreshed (" + why + "): what is shown here may be out of date. " +
      "Reload the page to see the current state.";
  }

  function clearStale(region) {
    if (!region || !region.classList) return;
    region.classList.remove("stale");
    var mark = region.querySelector(":scope > .stale-mark");
    if (mark) mark.remove();
  }

  function isRead(detail) {
    return ((detail.requestConfig || {}).verb || "get") === "get";
  }

  // A refusal comes back as a console fragment with a 4xx status: swap it in place so its
  // reason shows where the action was taken. Anything else that failed (a CSRF failure page,
  // a 500) is never swapped into a fragment: it becomes a notice at the top of the page.
  document.addEventListener("htmx:beforeSwap", function (evt) {
    var xhr = evt.detail.xhr;
    if (xhr.status >= 400 && xhr.getResponseHeader("X-Console-Fragment") === "1") {
      evt.detail.shouldSwap = true;
      evt.detail.isError = false;
    }
  });

  document.addEventListener("htmx:responseError", function (evt) {
    var xhr = evt.detail.xhr, read = isRead(evt.detail);
    var what = read ? "Refreshing this part of the page" : "Your action";
    if (read) markStale(evt.detail.target || evt.detail.elt, "HTTP " + xhr.status);
    if (xhr.status === 403) {
      notice(what + " was refused (403): your session or its security token is no longer valid. Reload the page and sign in again.");
    } else {
      notice(what + " failed (HTTP " + xhr.status + "). Nothing was changed by the console; reload the page to see the current state.");
    }
  });

  document.addEventListener("htmx:sendError", function (evt) {
    if (isRead(evt.detail)) markStale(evt.detail.target || evt.detail.elt, "server unreachable");
    notice("The server could not be reached. Check the connection and reload the page.");
  });

  document.addEventListener("htmx:afterSwap", function (evt) {
    clearNotice();
    clearStale(evt.detail.target);  // an outerHTML swap already replaced the marked region
    // After an action, move focus to the result so keyboard and screen-reader users hear it.
    var verb = (evt.detail.requestConfig || {}).verb;
    if (verb && verb !== "get") {
      var heading = evt.detail.target && document.querySelector("#decision h2, #resolution h2");
      if (heading) heading.focus();
    }
    tick();
  });
})();
