// agentrt approvers add: register this browser's passkey for one approver.
// The token comes from the address's fragment, never sent in a URL.
"use strict";
(function () {
  const token = new URLSearchParams(location.hash.slice(1)).get("token") || "";
  const said = document.getElementById("said");
  const b64 = {
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
  async function register() {
    said.textContent = "asking your authenticator…";
    const headers = { Authorization: "Bearer " + token };
    const asked = await fetch("/api/options", { headers: headers, cache: "no-store" });
    const options = await asked.json();
    if (!asked.ok) { throw new Error(options.error || asked.statusText); }
    options.challenge = b64.decode(options.challenge);
    options.user.id = b64.decode(options.user.id);
    (options.excludeCredentials || []).forEach(function (c) { c.id = b64.decode(c.id); });
    const credential = await navigator.credentials.create({ publicKey: options });
    const body = {
      id: credential.id,
      rawId: b64.encode(credential.rawId),
      type: credential.type,
      response: {
        clientDataJSON: b64.encode(credential.response.clientDataJSON),
        attestationObject: b64.encode(credential.response.attestationObject),
      },
    };
    const answer = await fetch("/api/register", {
      method: "POST",
      headers: Object.assign({ "Content-Type": "application/json" }, headers),
      body: JSON.stringify(body),
    });
    const result = await answer.json();
    if (!answer.ok) { throw new Error(result.error || answer.statusText); }
    said.textContent = "registered: " + result.name + " (" + result.subject + "); you can close this page";
    said.dataset.done = "yes";
  }
  document.getElementById("register").addEventListener("click", function () {
    register().catch(function (error) { said.textContent = "not registered: " + error.message; said.dataset.done = "failed"; });
  });
})();
