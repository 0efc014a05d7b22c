// Local time beside every UTC time, and countdowns that tick.
//
// The server renders times in UTC (<time datetime="…">2026-12-03 14:05 UTC</time>)
// and countdowns as the time left when the page was made, so every page reads
// right without JavaScript. This adds the viewer's own time after each <time>
// and counts each .countdown down from what the server said (the viewer's
// clock may be wrong; the time left is not). Content htmx swaps in gets the same.
(function () {
  "use strict";

  var zone = "";
  try {
    zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "";
  } catch (e) {
    zone = "";
  }

  function two(n) {
    return (n < 10 ? "0" : "") + n;
  }

  function localText(when) {
    return when.getFullYear() + "-" + two(when.getMonth() + 1) + "-" + two(when.getDate()) +
      " " + two(when.getHours()) + ":" + two(when.getMinutes());
  }

  function addLocalTimes(root) {
    if (!root.querySelectorAll || zone === "UTC" || zone === "Etc/UTC") {
      return; // the UTC time is the viewer's own
    }
    root.querySelectorAll("time[datetime]").forEach(function (el) {
      if (el.dataset.localShown) {
        return;
      }
      var when = new Date(el.getAttribute("datetime"));
      if (isNaN(when.getTime())) {
        return;
      }
      el.dataset.localShown = "1";
      var local = document.createElement("span");
      local.className = "local-time";
      local.textContent = " (" + localText(when) + " your time" + (zone ? ", " + zone : "") + ")";
      el.after(local);
    });
  }

  // The same words as the server's (portal/templatetags/storefront.py, remaining).
  function remaining(seconds) {
    var total = Math.max(0, Math.floor(seconds));
    var days = Math.floor(total / 86400);
    var hours = Math.floor((total % 86400) / 3600);
    var minutes = Math.floor((total % 3600) / 60);
    var secs = total % 60;
    if (days) {
      return days + " d " + hours + " h " + two(minutes) + " min";
    }
    if (hours) {
      return hours + " h " + two(minutes) + " min " + two(secs) + " s";
    }
    if (minutes) {
      return minutes + " min " + two(secs) + " s";
    }
    return secs + " s";
  }

  function tick() {
    var now = Date.now();
    document.querySelectorAll(".countdown[data-left]").forEach(function (el) {
      if (!el.countdownEnd) {
        el.countdownEnd = now + Number(el.dataset.left) * 1000;
      }
      var left = (el.countdownEnd - now) / 1000;
      if (left > 0) {
        el.textContent = remaining(left) + " left";
      } else if (!el.dataset.done) {
        el.dataset.done = "1";
        el.textContent = el.dataset.over;
        // The page's state (order_track.html) refreshes on this event.
        el.dispatchEvent(new CustomEvent("countdown-over", { bubbles: true }));
      }
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    addLocalTimes(document);
    tick();
    window.setInterval(tick, 1000);
  });
  document.addEventListener("htmx:load", function (event) {
    addLocalTimes(event.target);
  });
})();
