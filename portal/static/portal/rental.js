// The tracking page's rental block (templates/orders/_access.html): copy
// buttons, the countdown to the rental's end, and a reload when the rental
// becomes active while the page is open. Without JavaScript the page says the
// same things: the commands are selectable text, the time left is the
// server's, the token sits in a <details>.
(function () {
  "use strict";

  // --- copy buttons -------------------------------------------------------------

  function say(text) {
    var status = document.getElementById("copy-status");
    if (status) status.textContent = text;
  }

  function copyByCommand(text) {
    // For pages not served over HTTPS (a plain-HTTP test server on another
    // host), where navigator.clipboard does not exist. Styled through the
    // CSSOM, which the Content Security Policy allows.
    var area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.style.position = "fixed";
    area.style.opacity = "0";
    document.body.appendChild(area);
    area.select();
    var done = false;
    try {
      done = document.execCommand("copy");
    } catch (e) {
      done = false;
    }
    document.body.removeChild(area);
    return done ? Promise.resolve() : Promise.reject(new Error("copy refused"));
  }

  function copy(text) {
    if (navigator.clipboard && window.isSecureContext) {
      return navigator.clipboard.writeText(text).catch(function () {
        return copyByCommand(text);
      });
    }
    return copyByCommand(text);
  }

  function copied(button, label) {
    button.textContent = label;
    window.setTimeout(function () {
      button.textContent = "Copy";
    }, 2000);
  }

  function enableCopyButtons() {
    var buttons = document.querySelectorAll("#rental-access button.copy[data-copy]");
    Array.prototype.forEach.call(buttons, function (button) {
      var source = document.getElementById(button.getAttribute("data-copy"));
      if (!source) return;
      button.hidden = false;
      button.addEventListener("click", function () {
        var text = source.textContent.trim();
        copy(text).then(
          function () {
            copied(button, "Copied");
            say("Copied to the clipboard: " + text);
          },
          function () {
            // The browser refused: select the text so that Ctrl+C copies it.
            window.getSelection().selectAllChildren(source);
            copied(button, "Press Ctrl+C");
            say("Selected; press Ctrl+C (⌘C on a Mac) to copy it.");
          }
        );
      });
    });
  }

  // --- the countdown ----------------------------------------------------------------

  // The same words as portal/access.py: remaining_text.
  function remaining(ms) {
    var seconds = Math.floor(ms / 1000);
    if (seconds <= 0) return "ended";
    var days = Math.floor(seconds / 86400);
    var hours = Math.floor((seconds % 86400) / 3600);
    var minutes = Math.floor((seconds % 3600) / 60);
    if (days) return days + " d " + hours + " h left";
    if (hours) return hours + " h " + minutes + " min left";
    return minutes ? minutes + " min left" : "less than a minute left";
  }

  function startCountdown() {
    var element = document.getElementById("rental-remaining");
    if (!element) return;
    var ends = Date.parse(element.getAttribute("data-ends"));
    // Counted on the server's clock: the page says when it was made.
    var skew = Date.parse(element.getAttribute("data-now")) - Date.now();
    if (isNaN(ends) || isNaN(skew)) return;
    function tick() {
      element.textContent = remaining(ends - (Date.now() + skew));
    }
    tick();
    window.setInterval(tick, 15000);
  }

  // --- the rental starts while the page is open ---------------------------------------

  function status() {
    var element = document.querySelector("#status [data-status]");
    return element ? element.getAttribute("data-status") : "";
  }

  function reloadWhenActive() {
    // The status section refreshes itself (htmx); the access block does not,
    // so that a revealed token or a copied command stays put. When the order
    // turns active under the reader's eyes, the page is loaded once more.
    var first = status();
    if (first === "active") return;
    window.setInterval(function () {
      if (status() === "active") window.location.reload();
    }, 2000);
  }

  function start() {
    enableCopyButtons();
    startCountdown();
    reloadWhenActive();
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
