// Live progress of one run: poll its JSON every second while it is active.
(function () {
  const root = document.getElementById("run");
  const runUrl = root.dataset.api;
  const planUrl = root.dataset.plan;
  const active = new Set(["pending", "running", "waiting_approval"]);

  function summary(output) {
    if (!output || typeof output !== "object") return "";
    if (Array.isArray(output.remaining) || Array.isArray(output.evicted)) {
      const evicted = (output.evicted || []).length;
      const blocked = Object.keys(output.blocked || {}).length;
      const remaining = (output.remaining || []).length;
      return "evicted " + evicted + " · blocked " + blocked + " · remaining " + remaining;
    }
    const text = JSON.stringify(output);
    return text === "{}" ? "" : text.slice(0, 300);
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
    document.getElementById("run-status").textContent = run.status;
    let waiting = false;
    for (const step of run.steps) {
      const row = document.getElementById("step-" + step.id);
      if (!row) continue;
      row.querySelector(".step-status").textContent = step.status;
      row.querySelector(".step-progress").textContent = step.error || summary(step.output);
      if (step.status === "waiting_approval") waiting = true;
    }
    if (!waiting) {
      document.querySelectorAll("form.decision").forEach((form) => form.remove());
    }
    if (active.has(run.status)) setTimeout(poll, 1000);
  }

  async function plan() {
    const target = document.getElementById("plan");
    try {
      const response = await fetch(planUrl, { credentials: "same-origin" });
      if (!response.ok) return;
      const body = await response.json();
      target.textContent = "";
      const pre = document.createElement("pre");
      pre.id = "plan-live";
      pre.textContent = JSON.stringify(body, null, 2);
      target.appendChild(pre);
    } catch (e) {
      /* keep the steps' own description */
    }
  }

  plan();
  poll();
})();
