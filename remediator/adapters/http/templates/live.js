// Refresh the page's live parts every data-refresh seconds: fetch the page again and swap in
// each [data-live] element, except one holding a form being filled in.
(function () {
  const first = document.querySelector("[data-live][data-refresh]");
  if (!first) return;
  const seconds = Number(first.dataset.refresh) || 5;

  function busy(element) {
    return Array.from(element.querySelectorAll("textarea, input:not([type=hidden])")).some(
      (field) => field.value !== "" || field === document.activeElement);
  }

  async function refresh() {
    try {
      const response = await fetch(location.href, { credentials: "same-origin" });
      if (response.ok) {
        const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
        for (const old of document.querySelectorAll("[data-live]")) {
          if (busy(old)) continue;
          const replacement = fresh.getElementById(old.id);
          if (replacement) old.replaceWith(document.importNode(replacement, true));
        }
      }
    } catch (e) {
      /* the next interval tries again */
    }
    setTimeout(refresh, seconds * 1000);
  }

  setTimeout(refresh, seconds * 1000);
})();
