// Live run page: poll the run's JSON while it is active; when anything moved, fetch this page
// again and swap in its live parts (the decision card only while no comment is being typed).
(function () {
  const root = document.getElementById("run");
  const runUrl = root.dataset.api;
  const active = new Set(["pending", "running", "waiting_approval"]);
  let last = null;

  function signature(run) {
    return JSON.stringify([run.status, run.updatedAt, run.steps.map(
      (s) => [s.status, s.output, s.error, s.finishedAt])]);
  }

  function typing() {
    return Array.from(document.querySelectorAll("#decision textarea")).some(
      (t) => t.value !== "" || t === document.activeElement);
  }

  async function refresh() {
    const response = await fetch(location.href, { credentials: "same-origin" });
    if (!response.ok) return;
    const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
    for (const old of document.querySelectorAll("[data-live]")) {
      if (old.id === "decision" && typing()) continue;
      const replacement = fresh.getElementById(old.id);
      if (replacement) old.replaceWith(document.importNode(replacement, true));
    }
    const status = fresh.getElementById("run-status");
    const current = document.getElementById("run-status");
    if (status && current) {
      current.textContent = status.textContent;
      current.className = status.className;
    }
  }

  async function poll() {
    let run;
    try {
      const response = await fetch(runUrl, { credentials: "same-origin" });
      if (!response.ok) return setTimeout(poll, 2000);
      run = await response.json();
    } catch (e) {
      return setTimeout(poll, 2000);
    }
    const seen = signature(run);
    const shown = document.getElementById("run-status").textContent.trim();
    if ((last !== null && seen !== last) || (last === null && run.status !== shown)) {
      try { await refresh(); } catch (e) { /* the next change tries again */ }
    }
    last = seen;
    if (active.has(run.status)) setTimeout(poll, 1000);
  }

  poll();
})();
