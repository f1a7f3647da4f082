// The console's only script: live status refresh by polling (one indexed lookup of the
// workflows a page shows), and actions sent as POSTs with the page's CSRF token after a
// confirmation. Values are written with textContent only, never as HTML.
(function () {
  "use strict";
  var REFRESH_MS = 2000;

  function csrfToken() {
    var meta = document.querySelector('meta[name="csrf-token"]');
    return meta ? meta.getAttribute("content") : "";
  }

  function formatTime(ms) {
    var d = new Date(ms);
    return d.toISOString().replace("T", " ").replace("Z", "");
  }

  function refresh(container) {
    var rows = container.querySelectorAll("[data-workflow-id]");
    if (container.hasAttribute("data-workflow-id")) { rows = [container]; }
    if (!rows.length) { return; }
    var params = new URLSearchParams();
    function keyOf(row) {
      return row.getAttribute("data-workflow-id") + "\u0000" + (row.getAttribute("data-shard-key") || "");
    }
    rows.forEach(function (row) {
      params.append("id", row.getAttribute("data-workflow-id"));
      if (row.getAttribute("data-shard-key")) { params.append("key", row.getAttribute("data-shard-key")); }
    });
    fetch(container.getAttribute("data-live") + "?" + params.toString(),
          { headers: { "Accept": "application/json" }, credentials: "same-origin" })
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(function (statuses) {
        if (!statuses) { return; }
        var byKey = {};
        statuses.forEach(function (s) { byKey[s.id + "\u0000" + s.key] = s; });
        rows.forEach(function (row) {
          var now = byKey[keyOf(row)];
          if (!now) { return; }
          var cell = row.querySelector("[data-status]");
          if (cell && cell.textContent !== now.status) {
            cell.textContent = now.status;
            cell.className = "status status-" + now.status;
          }
          var updated = row.querySelector("[data-updated]");
          if (updated) { updated.textContent = formatTime(now.updated_at); }
        });
      })
      .catch(function () { /* the next tick tries again */ });
  }

  function live() {
    document.querySelectorAll("[data-live]").forEach(function (container) {
      setInterval(function () { refresh(container); }, REFRESH_MS);
    });
  }

  function actions() {
    document.querySelectorAll("form[data-confirm]").forEach(function (form) {
      form.addEventListener("submit", function (event) {
        event.preventDefault();
        if (!window.confirm(form.getAttribute("data-confirm"))) { return; }
        var result = document.getElementById("action-result");
        fetch(form.action, {
          method: "POST", credentials: "same-origin",
          headers: { "Accept": "application/json", "X-CSRF-Token": csrfToken(),
                     "Content-Type": "application/x-www-form-urlencoded" },
          body: new URLSearchParams(new FormData(form)).toString()
        }).then(function (response) {
          return response.json().then(function (body) { return [response.ok, body]; });
        }).then(function (answer) {
          if (!answer[0]) {
            if (result) { result.textContent = answer[1].error || "Refused"; }
            return;
          }
          if (!result) { window.location.reload(); return; }
          result.textContent = "Done: " + (answer[1].status || "");
          var live = document.getElementById("workflow");
          if (live) { refresh(live); }
        }).catch(function (error) {
          if (result) { result.textContent = String(error); }
        });
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () { live(); actions(); });
})();
