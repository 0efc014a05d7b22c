// Keyboard shortcuts of the review queue (the page lists them: press ?).
// Each key clicks the element marked data-shortcut="<key>", so a key does
// exactly what its button or link does, htmx included.
(function () {
  "use strict";

  function typing(element) {
    if (!element) return false;
    return element.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(element.tagName);
  }

  function pressed(key) {
    return document.querySelector('#review-item [data-shortcut="' + key + '"]');
  }

  // The pane the page loads after it: htmx swaps no error answer, so a pane
  // that cannot load (its item gone, the server down) says so instead of
  // "Loading …" for good; its link still opens the item's own page.
  document.addEventListener("htmx:responseError", function (event) {
    var loading = document.getElementById("review-loading");
    if (!loading || !event.detail.elt || event.detail.elt.id !== "review-item") return;
    event.detail.elt.removeAttribute("aria-busy");
    loading.firstChild.textContent = "This item could not be loaded (" +
      event.detail.xhr.status + "); reload the queue, or open ";
  });
  document.addEventListener("htmx:sendError", function (event) {
    var loading = document.getElementById("review-loading");
    if (!loading || !event.detail.elt || event.detail.elt.id !== "review-item") return;
    event.detail.elt.removeAttribute("aria-busy");
    loading.firstChild.textContent = "The server did not answer; reload the queue, or open ";
  });

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || event.isComposing) return;
    if (typing(event.target)) {
      // Enter is left to the browser: it submits the field's form (in the
      // reason field, with the form's first button, Reject).
      if (event.key === "Escape") event.target.blur();
      return;
    }
    var help = document.getElementById("review-help");
    if (event.key === "?") {
      if (help) help.open = !help.open;
      event.preventDefault();
      return;
    }
    if (event.key === "Escape") {
      if (help) help.open = false;
      return;
    }
    if (event.key === "r") {
      var reason = document.querySelector('#review-item input[name="note"]');
      if (reason) {
        // Without preventDefault the "r" would be typed into the field.
        event.preventDefault();
        reason.focus();
        reason.select();
      }
      return;
    }
    if (event.key.length !== 1 || "jkaqu".indexOf(event.key) === -1) return;
    var target = pressed(event.key);
    if (target) {
      event.preventDefault();
      // htmx binds swapped-in content after its settle delay: a key pressed
      // in those milliseconds would click an unbound button, and the browser
      // would submit the form itself (a full page load). Bind it first
      // (htmx.process leaves an element it already bound as it is).
      if (window.htmx) window.htmx.process(target.closest("form") || target);
      target.click();
    }
  });
})();
