// The inbox page. Every string from the server goes into the page with
// textContent (never innerHTML), so markup a model or a server chose is text.
// The token comes from the address's fragment (never sent to the server as
// part of a URL) and travels only in the Authorization header.
"use strict";

(function () {
  const KEEP_DECIDED_MS = 8000;
  const state = { token: "", csrf: "", runsOffset: 0, runsLimit: 50, openRun: null, refreshing: false, again: false };

  function $(id) { return document.getElementById(id); }

  function element(tag, className, text) {
    const node = document.createElement(tag);
    if (className) { node.className = className; }
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    return node;
  }

  function takeToken() {
    const match = /^#token=([A-Za-z0-9_-]+)$/.exec(window.location.hash);
    if (match) {
      sessionStorage.setItem("agentrt-inbox-token", match[1]);
      // Out of the address bar, the history and any screenshot.
      history.replaceState(null, "", window.location.pathname);
    }
    return sessionStorage.getItem("agentrt-inbox-token") || "";
  }

  function headers(extra) {
    return Object.assign({ "Authorization": "Bearer " + state.token }, extra || {});
  }

  async function api(path, options) {
    const response = await fetch(path, Object.assign({ headers: headers(), cache: "no-store", credentials: "omit" }, options || {}));
    let body = null;
    try { body = await response.json(); } catch (error) { body = null; }
    if (!response.ok) {
      const message = body && typeof body.error === "string" ? body.error : "the inbox answered " + response.status;
      const failure = new Error(message);
      failure.status = response.status;
      throw failure;
    }
    return body;
  }

  function showProblem(message) {
    const node = $("problem");
    node.textContent = message || "";
    node.hidden = !message;
  }

  // -- blocks of numbered lines ------------------------------------------------

  function linesBlock(block, numbered) {
    const wrapper = element("div", "block");
    const table = element("table");
    block.lines.forEach(function (line, index) {
      const row = element("tr");
      if (numbered) { row.appendChild(element("td", "number", index + 1)); }
      row.appendChild(element("td", "text", line));
      table.appendChild(row);
    });
    wrapper.appendChild(table);
    const out = element("div");
    out.appendChild(wrapper);
    if (block.omitted > 0) {
      out.appendChild(element("p", "cut", block.omitted + " more lines not shown here (the page sends at most 20,000 lines of one text)"));
    }
    return out;
  }

  function plainLines(lines) {
    return linesBlock({ lines: lines, omitted: 0 }, false);
  }

  function diffBlock(edit) {
    const wrapper = element("div", "block");
    const table = element("table");
    edit.diff.forEach(function (line) {
      const kind = { "+": "add", "-": "del", "@": "hunk" }[line.sign] || "same";
      const row = element("tr", kind);
      row.appendChild(element("td", "number", line.sign === "@" ? "" : line.sign));
      row.appendChild(element("td", "text", line.text));
      table.appendChild(row);
    });
    wrapper.appendChild(table);
    const out = element("div");
    out.appendChild(element("p", "block-caption", edit.label + " (old " + edit.old_size + ", new " + edit.new_size + ")"));
    out.appendChild(wrapper);
    if (edit.omitted > 0) { out.appendChild(element("p", "cut", edit.omitted + " more diff lines not shown here")); }
    return out;
  }

  // -- approvals ---------------------------------------------------------------

  function fill(card, name, value) {
    const node = card.querySelector('[data-field="' + name + '"]');
    if (!node) { return; }
    node.textContent = value === null || value === undefined ? "-" : String(value);
  }

  function approvalCard(view) {
    const card = $("approval-template").content.firstElementChild.cloneNode(true);
    card.dataset.approval = view.decide.approval_id;
    card.dataset.hash = view.approval_hash;
    ["tool", "kind", "reason", "run_id", "goal", "approval_id", "step", "created_at", "approval_hash"].forEach(function (name) {
      fill(card, name, view[name]);
    });
    fill(card, "server", view.server === null ? "(not recorded in the database)" : view.server);
    fill(card, "expires_at", view.expires_at === null ? "never" : new Date(view.expires_at * 1000).toISOString());
    fill(card, "arguments_size", "(" + view.arguments.size + ")");
    ["kind_note", "warning"].forEach(function (name) {
      if (view[name]) {
        const node = card.querySelector('[data-field="' + name + '"]');
        node.textContent = view[name];
        node.hidden = false;
      }
    });
    if (view.description !== null) {
      const box = card.querySelector(".description-box");
      box.hidden = false;
      card.querySelector('[data-block="description"]').appendChild(plainLines(view.description));
    }
    const writes = card.querySelector('[data-block="writes"]');
    view.writes.forEach(function (write) {
      const ending = write.ends_with_newline ? ", ends with a newline" : ", no newline at the end";
      writes.appendChild(element("h4", "", write.label + " — " + write.line_count + " lines, " + write.size + ending));
      writes.appendChild(linesBlock(write, true));
    });
    const edits = card.querySelector('[data-block="edits"]');
    view.edits.forEach(function (edit) { edits.appendChild(diffBlock(edit)); });
    card.querySelector('[data-block="arguments"]').appendChild(linesBlock(view.arguments, true));
    card.querySelector('[data-block="capability"]').appendChild(plainLines(view.capability));
    card.querySelector('[data-block="presentation"]').appendChild(plainLines(view.presentation));
    card.querySelectorAll("button[data-verdict]").forEach(function (button) {
      button.addEventListener("click", function () { decide(card, view, button.dataset.verdict); });
    });
    fill(card, "host_session", view.host_session);
    fill(card, "principal", view.principal);
    if (view.clear_taint) {
      // The operator's reset of the session's taint (docs/flows.md); the approval stays.
      const clear = card.querySelector("button[data-clear-taint]");
      clear.hidden = false;
      clear.addEventListener("click", function () { clearTaint(card, view, clear); });
    }
    return card;
  }

  async function clearTaint(card, view, button) {
    const outcome = card.querySelector('[data-field="outcome"]');
    button.disabled = true;
    try {
      const cleared = await api("/api/taint/clear", {
        method: "POST",
        headers: headers({ "Content-Type": "application/json", "X-CSRF-Token": state.csrf }),
        body: JSON.stringify({
          session: view.clear_taint,
          by: $("by").value,
          note: card.querySelector('input[name="note"]').value,
        }),
      });
      outcome.className = "outcome ok";
      outcome.textContent = "cleared " + cleared.labels.join(", ") + " from host session " + cleared.session;
    } catch (error) {
      outcome.className = "outcome bad";
      outcome.textContent = "not cleared: " + error.message;
      button.disabled = false;
    }
  }

  // A standing grant asked with the approval: its scope and hash are fetched and shown, and
  // the person confirms that scope; the decision then names the hash shown.
  async function grantShown(card, view) {
    const calls = card.querySelector('input[name="grant_calls"]').value.trim();
    const duration = card.querySelector('input[name="grant_for"]').value.trim();
    const when = card.querySelector('input[name="grant_when"]').value.trim();
    if (!calls && !duration && !when) { return null; }
    const asked = { run_id: view.decide.run_id, approval_id: view.decide.approval_id };
    if (calls) { asked.calls = Number(calls); }
    if (duration) { asked.for = duration; }
    if (when) { asked.when = when; }
    const scope = await api("/api/grant-scope", {
      method: "POST",
      headers: headers({ "Content-Type": "application/json", "X-CSRF-Token": state.csrf }),
      body: JSON.stringify(asked),
    });
    const shown = card.querySelector('[data-field="grant_scope"]');
    shown.textContent = scope.lines.join("\n");
    shown.hidden = false;
    if (!window.confirm("Approve, and give this standing grant?\n\n" + scope.lines.join("\n"))) {
      throw new Error("the grant was not confirmed");
    }
    asked.scope_hash = scope.scope_hash;
    delete asked.run_id;
    delete asked.approval_id;
    return asked;
  }

  // Passkey mode (docs/identity.md): the server derives the challenge from the approval and
  // the verdict (and the grant's scope hash), and the authenticator signs it with user
  // verification; the assertion rides with the decision.
  const b64url = {
    decode: function (text) {
      const padded = text.replace(/-/g, "+").replace(/_/g, "/") + "===".slice((text.length + 3) % 4);
      return Uint8Array.from(atob(padded), function (c) { return c.charCodeAt(0); });
    },
    encode: function (buffer) {
      let text = "";
      new Uint8Array(buffer).forEach(function (byte) { text += String.fromCharCode(byte); });
      return btoa(text).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
    },
  };

  async function passkeyAssertion(body, grant) {
    const asked = { approval_id: body.approval_id, approval_hash: body.approval_hash, verdict: body.verdict };
    if (grant) { asked.scope_hash = grant.scope_hash; }
    const options = await api("/api/passkey/challenge", {
      method: "POST",
      headers: headers({ "Content-Type": "application/json", "X-CSRF-Token": state.csrf }),
      body: JSON.stringify(asked),
    });
    options.challenge = b64url.decode(options.challenge);
    options.allowCredentials.forEach(function (credential) { credential.id = b64url.decode(credential.id); });
    const credential = await navigator.credentials.get({ publicKey: options });
    return {
      id: credential.id,
      rawId: b64url.encode(credential.rawId),
      type: credential.type,
      response: {
        authenticatorData: b64url.encode(credential.response.authenticatorData),
        clientDataJSON: b64url.encode(credential.response.clientDataJSON),
        signature: b64url.encode(credential.response.signature),
      },
    };
  }

  async function decide(card, view, verdict) {
    const outcome = card.querySelector('[data-field="outcome"]');
    const buttons = card.querySelectorAll("button[data-verdict]");
    buttons.forEach(function (button) { button.disabled = true; });
    outcome.className = "outcome";
    outcome.textContent = verdict === "approve" ? "approving…" : "rejecting…";
    card.dataset.deciding = "yes";
    try {
      const grant = verdict === "approve" ? await grantShown(card, view) : null;
      const body = {
        verdict: verdict,
        run_id: view.decide.run_id,
        approval_id: view.decide.approval_id,
        approval_hash: view.approval_hash,
        by: $("by").value,
        note: card.querySelector('input[name="note"]').value,
      };
      if (grant) { body.grant = grant; }
      if (state.approvalAuth === "passkey") {
        outcome.textContent = "your passkey signs this decision…";
        body.assertion = await passkeyAssertion(body, grant);
      }
      const decided = await api("/api/decide", {
        method: "POST",
        headers: headers({ "Content-Type": "application/json", "X-CSRF-Token": state.csrf }),
        body: JSON.stringify(body),
      });
      outcome.className = "outcome ok";
      if (decided.status === "pending") {
        outcome.textContent = "approved by " + decided.approvers.join(", ") + "; waits for " + decided.waiting_for + " more approver(s)";
        buttons.forEach(function (button) { button.disabled = false; });
        return;
      }
      outcome.textContent = (decided.status === "approved"
        ? "approved by " + decided.by + "; this exact request runs when its run resumes (through the proxy: when the host calls again with the same arguments)"
        : "rejected by " + decided.by + "; the run is cancelled");
      card.dataset.decidedAt = String(Date.now());
      card.classList.add("decided");
      refresh();
      window.setTimeout(refresh, KEEP_DECIDED_MS + 500);
    } catch (error) {
      outcome.className = "outcome bad";
      outcome.textContent = "not decided: " + error.message;
      buttons.forEach(function (button) { button.disabled = false; });
    } finally {
      delete card.dataset.deciding;
    }
  }

  function renderApprovals(list) {
    const container = $("waiting");
    const wanted = new Map();
    list.forEach(function (view) { wanted.set(view.decide.approval_id + " " + view.approval_hash, view); });
    Array.from(container.children).forEach(function (card) {
      // A card just decided stays a few seconds, so its message can be read.
      // So does one whose decision is on its way (a passkey's prompt can take a while).
      const recent = card.dataset.deciding || (card.dataset.decidedAt && Date.now() - Number(card.dataset.decidedAt) < KEEP_DECIDED_MS);
      if (!wanted.has(card.dataset.approval + " " + card.dataset.hash) && !recent) { card.remove(); }
    });
    let previous = null;
    list.forEach(function (view) {
      const key = view.decide.approval_id + " " + view.approval_hash;
      let card = Array.from(container.children).find(function (node) {
        return node.dataset.approval + " " + node.dataset.hash === key;
      });
      if (!card) { card = approvalCard(view); }
      if (previous === null) { container.prepend(card); } else { previous.after(card); }
      previous = card;
    });
    $("waiting-count").textContent = "(" + list.length + ")";
    $("waiting-empty").hidden = container.children.length > 0;
  }

  // -- runs ------------------------------------------------------------------

  function renderRuns(page) {
    const body = $("runs").querySelector("tbody");
    body.replaceChildren();
    page.runs.forEach(function (run) {
      const row = element("tr", run.status === "waiting_for_approval" ? "waiting" : "");
      const cell = element("td");
      const link = element("a", "", run.run_id);
      link.href = "#";
      link.addEventListener("click", function (event) { event.preventDefault(); openRun(run.link); });
      cell.appendChild(link);
      row.appendChild(cell);
      const status = run.reason && run.reason !== run.status ? run.status + " (" + run.reason + ")" : run.status;
      [status, run.steps, run.approval ? run.approval + " (" + run.approval_status + ")" : "-", run.updated_at, run.goal].forEach(function (value) {
        row.appendChild(element("td", "", value));
      });
      body.appendChild(row);
    });
    const last = page.offset + page.runs.length;
    $("runs-count").textContent = page.runs.length ? "(" + (page.offset + 1) + "–" + last + " of " + page.total + ")" : "(" + page.total + ")";
    $("runs-newer").disabled = page.offset === 0;
    $("runs-older").disabled = last >= page.total;
  }

  function field(list, name, value) {
    list.appendChild(element("dt", "", name));
    list.appendChild(element("dd", "", value === null || value === undefined ? "-" : value));
  }

  function renderRun(detail) {
    $("run-section").hidden = false;
    $("run-title").textContent = detail.run.run_id;
    const fields = $("run-fields");
    fields.replaceChildren();
    field(fields, "status", detail.run.status);
    field(fields, "reason", detail.run.reason || "-");
    field(fields, "goal", detail.run.goal);
    field(fields, "result", detail.run.result);
    field(fields, "created", detail.run.created_at);
    field(fields, "updated", detail.run.updated_at);
    field(fields, "metadata", detail.run.metadata.join("\n"));
    const steps = $("steps");
    steps.replaceChildren();
    detail.steps.forEach(function (step) {
      const box = element("div", "step");
      box.appendChild(element("div", "step-head", "step " + step.step + "  " + step.tool + "  " + step.status + "  observed " + step.observed));
      box.appendChild(element("p", "block-caption", "arguments (" + step.arguments.size + ")"));
      box.appendChild(linesBlock(step.arguments, false));
      if (step.content !== null) {
        box.appendChild(element("p", "block-caption", "observation (" + step.content.line_count + " lines, " + step.content.size + ")"));
        box.appendChild(linesBlock(step.content, true));
      }
      steps.appendChild(box);
    });
    $("steps-count").textContent = "(" + detail.steps.length + " of " + detail.step_total + ")";
    const events = $("events");
    events.replaceChildren();
    detail.events.forEach(function (event) {
      const box = element("div", "event");
      box.appendChild(element("div", "event-head", event.seq + "  " + event.type + "  " + event.created_at));
      box.appendChild(plainLines(event.payload));
      events.appendChild(box);
    });
    $("events-count").textContent = "(" + detail.events.length + " of " + detail.event_total + ")";
  }

  async function openRun(runId) {
    state.openRun = runId;
    try {
      renderRun(await api("/api/runs/" + encodeURIComponent(runId)));
      $("run-section").scrollIntoView();
    } catch (error) { showProblem(error.message); }
  }

  function renderChain(report) {
    const badge = $("chain");
    badge.className = "badge " + (report.ok ? "ok" : "bad");
    badge.textContent = report.ok
      ? "chain intact: " + report.checked + " events, head " + report.head_seq + ":" + report.head_hash
      : "chain BROKEN at event " + report.first_bad_seq + ": " + report.reason;
  }

  // -- refreshing --------------------------------------------------------------

  async function refresh() {
    if (state.refreshing) { state.again = true; return; }
    state.refreshing = true;
    try {
      const waiting = await api("/api/approvals");
      renderApprovals(waiting.approvals);
      renderRuns(await api("/api/runs?limit=" + state.runsLimit + "&offset=" + state.runsOffset));
      renderChain(await api("/api/verify"));
      if (state.openRun !== null) { renderRun(await api("/api/runs/" + encodeURIComponent(state.openRun))); }
      showProblem("");
    } catch (error) {
      showProblem(error.message);
    } finally {
      state.refreshing = false;
      if (state.again) { state.again = false; refresh(); }
    }
  }

  // Server-sent events over fetch: EventSource cannot send the Authorization header.
  async function listen() {
    const badge = $("connection");
    for (;;) {
      try {
        const response = await fetch("/api/stream", { headers: headers(), cache: "no-store", credentials: "omit" });
        if (!response.ok) { throw new Error("the stream answered " + response.status); }
        badge.className = "badge ok";
        badge.textContent = "live";
        const reader = response.body.getReader();
        const decoder = new TextDecoder();
        let buffer = "";
        for (;;) {
          const chunk = await reader.read();
          if (chunk.done) { break; }
          buffer += decoder.decode(chunk.value, { stream: true });
          let end;
          while ((end = buffer.indexOf("\n\n")) >= 0) {
            const message = buffer.slice(0, end);
            buffer = buffer.slice(end + 2);
            if (/^event: change$/m.test(message)) { refresh(); }
          }
        }
      } catch (error) {
        badge.className = "badge bad";
        badge.textContent = "disconnected, retrying";
      }
      await new Promise(function (resolve) { window.setTimeout(resolve, 1000); });
    }
  }

  async function start() {
    state.token = takeToken();
    if (!state.token) { $("no-token").hidden = false; return; }
    try {
      const session = await api("/api/session");
      state.csrf = session.csrf;
      state.approvalAuth = session.approval_auth;
      if (!$("by").value) { $("by").value = session.login; }
    } catch (error) {
      showProblem(error.message);
      if (error.status === 401) { $("no-token").hidden = false; }
      return;
    }
    $("runs-newer").addEventListener("click", function () { state.runsOffset = Math.max(0, state.runsOffset - state.runsLimit); refresh(); });
    $("runs-older").addEventListener("click", function () { state.runsOffset += state.runsLimit; refresh(); });
    await refresh();
    listen();
  }

  document.addEventListener("DOMContentLoaded", start);
})();
