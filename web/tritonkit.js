// ComfyUI-TritonKit frontend: the "Triton" sidebar tab, the startup self-test with a toast on
// failure, the report text on the TritonKit nodes after they run, and an about-page badge.
//
// One plain ES module, no build step: ComfyUI imports every .js under web/ as an extension,
// so this is the only file there. It uses only extension APIs present in frontend 1.32.9
// (pinned by ComfyUI 0.3.75) and the newer ones: registerSidebarTab, settings,
// extensionManager.setting/toast, aboutPageBadges, commands, beforeRegisterNodeDef,
// api.fetchApi (which adds the /api prefix itself) and api.addEventListener.

const { app } = window.comfyAPI.app;
const { api } = window.comfyAPI.api;

const EXT_NAME = "TritonKit";
const TAB_ID = "tritonkit";
const SETTING_STARTUP = "TritonKit.RunSelfTestOnStartup";
const README_URL = "https://github.com/tritonkit/ComfyUI-TritonKit#readme";
const PANEL_README_URL = "https://github.com/tritonkit/ComfyUI-TritonKit#the-triton-panel";
// node id -> how its text is shown on the node after it runs
const TEXT_NODES = {
  TritonKitSelfTest: { minHeight: 200, label: "report" },
  TritonKitAttention: { minHeight: 56, label: "path" },
  TritonKitFp8Fallback: { minHeight: 56, label: "path" },
  TritonKitCompileModel: { minHeight: 56, label: "plan" },
};

// ----------------------------------------------------------------------------------- state

const store = {
  status: null, // GET /tritonkit/status
  result: null, // the last self-test result (POST /tritonkit/selftest or status.selftest)
  running: false,
  runningSince: null,
  pending: null,
  error: null, // the last request error, as text
  clearing: false,
  clearResult: null,
  listeners: new Set(),
};

function emit() {
  for (const fn of [...store.listeners]) {
    try {
      fn();
    } catch (e) {
      console.warn("[TritonKit] panel update failed", e);
    }
  }
}

async function call(path, { method = "GET", body } = {}) {
  const init = { method, headers: {} };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  const resp = await api.fetchApi(`/tritonkit/${path}`, init);
  let data;
  try {
    data = await resp.json();
  } catch {
    data = { error: `HTTP ${resp.status} (not JSON)` };
  }
  return { status: resp.status, ok: resp.ok, data };
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function refreshStatus(refresh = false) {
  try {
    const r = await call(refresh ? "status?refresh=true" : "status");
    if (!r.ok) throw new Error(r.data?.error || `HTTP ${r.status}`);
    store.status = r.data;
    if (r.data.selftest && (!store.result || r.data.selftest.finished_at >= store.result.finished_at)) {
      store.result = r.data.selftest;
    }
    store.error = null;
  } catch (e) {
    store.error = `Could not read the Triton status: ${e.message || e}`;
  }
  emit();
  return store.status;
}

// Waits for a self-test that another tab (or the startup check) started; returns its result.
async function waitForRunningSelftest(timeoutMs = 15 * 60 * 1000) {
  const end = Date.now() + timeoutMs;
  while (Date.now() < end) {
    await sleep(1000);
    const s = await refreshStatus();
    if (s && !s.running) return s.selftest;
  }
  throw new Error("the self-test started elsewhere did not finish in time");
}

function runSelfTest() {
  if (store.pending) return store.pending;
  store.running = true;
  store.runningSince = Date.now();
  store.error = null;
  emit();
  store.pending = (async () => {
    try {
      const r = await call("selftest", { method: "POST", body: {} });
      let result;
      if (r.status === 409) result = await waitForRunningSelftest();
      else if (!r.ok) throw new Error(r.data?.error || `HTTP ${r.status}`);
      else result = r.data;
      if (result) store.result = result;
      await refreshStatus();
      return store.result;
    } catch (e) {
      store.error = `The self-test request failed: ${e.message || e}`;
      return null;
    } finally {
      store.running = false;
      store.runningSince = null;
      store.pending = null;
      emit();
    }
  })();
  return store.pending;
}

async function clearCaches() {
  store.clearing = true;
  store.clearResult = null;
  emit();
  try {
    const r = await call("caches/clear", { method: "POST", body: {} });
    if (!r.ok) throw new Error(r.data?.error || `HTTP ${r.status}`);
    store.clearResult = r.data;
    if (store.status?.environment) {
      for (const [name, c] of Object.entries(r.data.caches || {})) {
        store.status.environment.caches[name] = c;
      }
    }
  } catch (e) {
    store.clearResult = { ok: false, error: String(e.message || e) };
  } finally {
    store.clearing = false;
    emit();
  }
}

// ----------------------------------------------------------------------------------- toasts

function toast(msg) {
  const t = app.extensionManager?.toast;
  if (t?.add) t.add(msg);
  else console.warn(`[TritonKit] ${msg.summary}: ${msg.detail}`);
}

function toastFailure(result) {
  const tri = result?.triage;
  toast({
    severity: "error",
    summary: `Triton self-test failed: ${tri?.title || "unknown problem"}`,
    detail: `${tri?.key ? `[${tri.key}] ` : ""}Fix: ${tri?.fix || "open the Triton tab for the full report."}`,
    life: 30000,
    closable: true,
  });
}

function settingGet(id, fallback) {
  try {
    const v = app.extensionManager?.setting?.get(id);
    return v === undefined || v === null ? fallback : v;
  } catch {
    return fallback;
  }
}

async function startupCheck() {
  if (!settingGet(SETTING_STARTUP, true)) {
    await refreshStatus();
    return;
  }
  const s = await refreshStatus();
  let result = s?.selftest || null;
  if (!result && s?.running) {
    store.running = true;
    emit();
    try {
      result = await waitForRunningSelftest();
    } finally {
      store.running = false;
      emit();
    }
  } else if (!result && s) {
    result = await runSelfTest();
  }
  if (result && !result.ok) toastFailure(result);
}

// ----------------------------------------------------------------------------------- DOM

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "style") el.style.cssText = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function injectStyle() {
  if (document.getElementById("tritonkit-style")) return;
  const css = `
.tritonkit-panel { padding: 12px; display: flex; flex-direction: column; gap: 10px; font-size: 13px; line-height: 1.4; }
.tritonkit-panel h3 { margin: 0; font-size: 16px; display: flex; align-items: center; gap: 8px; }
.tritonkit-panel h4 { margin: 6px 0 0; font-size: 13px; opacity: .8; text-transform: uppercase; letter-spacing: .04em; }
.tritonkit-verdict { padding: 8px 10px; border-radius: 6px; font-weight: 600; border: 1px solid transparent; }
.tritonkit-verdict[data-state="pass"] { background: rgba(34,197,94,.15); border-color: rgba(34,197,94,.6); }
.tritonkit-verdict[data-state="fail"] { background: rgba(239,68,68,.15); border-color: rgba(239,68,68,.7); }
.tritonkit-verdict[data-state="unknown"], .tritonkit-verdict[data-state="running"] { background: rgba(148,163,184,.15); border-color: rgba(148,163,184,.5); }
.tritonkit-verdict small { display: block; font-weight: 400; opacity: .8; }
.tritonkit-triage { overflow-wrap: anywhere; padding: 8px 10px; border-left: 3px solid rgba(239,68,68,.8); background: rgba(239,68,68,.07); }
.tritonkit-triage code { word-break: break-word; }
.tritonkit-actions { display: flex; flex-wrap: wrap; gap: 6px; }
.tritonkit-btn { cursor: pointer; padding: 5px 12px; border-radius: 6px; border: 1px solid rgba(148,163,184,.6); background: rgba(148,163,184,.12); color: inherit; font: inherit; }
.tritonkit-btn:hover:not([disabled]) { background: rgba(148,163,184,.25); }
.tritonkit-btn[disabled] { opacity: .5; cursor: default; }
.tritonkit-btn.tritonkit-primary { background: rgba(59,130,246,.8); border-color: rgba(59,130,246,1); color: #fff; }
.tritonkit-btn.tritonkit-danger { background: rgba(239,68,68,.8); border-color: rgba(239,68,68,1); color: #fff; }
.tritonkit-progress { display: flex; flex-direction: column; gap: 4px; }
.tritonkit-bar { height: 4px; border-radius: 2px; background: rgba(148,163,184,.25); overflow: hidden; position: relative; }
.tritonkit-bar::after { content: ""; position: absolute; inset: 0; width: 35%; background: rgba(59,130,246,.9); animation: tritonkit-slide 1.1s ease-in-out infinite; }
@keyframes tritonkit-slide { from { transform: translateX(-100%); } to { transform: translateX(290%); } }
.tritonkit-facts { border-collapse: collapse; width: 100%; }
.tritonkit-facts th { text-align: left; font-weight: 500; opacity: .75; padding: 2px 8px 2px 0; vertical-align: top; white-space: nowrap; }
.tritonkit-facts td { padding: 2px 0; overflow-wrap: anywhere; }
.tritonkit-confirm { padding: 8px 10px; border: 1px solid rgba(239,68,68,.6); border-radius: 6px; display: flex; flex-direction: column; gap: 6px; }
.tritonkit-error { color: rgb(239,68,68); }
.tritonkit-panel pre, .tritonkit-node-text { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 11px; white-space: pre-wrap; word-break: break-word; }
.tritonkit-panel pre { max-height: 320px; overflow: auto; background: rgba(0,0,0,.2); padding: 8px; border-radius: 6px; margin: 4px 0 0; }
.tritonkit-node-text { width: 100%; height: 100%; box-sizing: border-box; resize: none; background: rgba(0,0,0,.25); color: inherit; border: 1px solid rgba(148,163,184,.35); border-radius: 4px; padding: 4px; }
.tritonkit-node-text[data-state="fail"] { border-color: rgba(239,68,68,.8); }
.tritonkit-muted { opacity: .7; }
`;
  document.head.append(h("style", { id: "tritonkit-style" }, css));
}

function fmtBytes(n) {
  if (n === null || n === undefined) return "?";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return i === 0 ? `${n} B` : `${n.toFixed(1)} ${units[i]}`;
}

function fmtTime(unixSeconds) {
  if (!unixSeconds) return "";
  return new Date(unixSeconds * 1000).toLocaleTimeString();
}

function verdict() {
  if (store.running) {
    const secs = store.runningSince ? Math.round((Date.now() - store.runningSince) / 1000) : 0;
    return h("div", { class: "tritonkit-verdict", "data-state": "running", "data-tk": "verdict" },
      "Self-test: running…", h("small", {}, `${secs} s; compiling and running the vector add`));
  }
  const r = store.result;
  if (!r) {
    return h("div", { class: "tritonkit-verdict", "data-state": "unknown", "data-tk": "verdict" },
      "Self-test: not run yet", h("small", {}, "Press “Run self-test” to compile and run Triton’s vector add."));
  }
  const st = r.report?.selftest || {};
  const where = [st.device, st.backend].filter(Boolean).join(", ");
  const timing = st.first_call_s != null ? `cold ${(st.first_call_s * 1000).toFixed(0)} ms, warm ${Number(st.warm_ms).toFixed(2)} ms` : "";
  return h("div", { class: "tritonkit-verdict", "data-state": r.ok ? "pass" : "fail", "data-tk": "verdict" },
    `Self-test: ${r.ok ? "PASS" : "FAIL"}`,
    h("small", {}, [`vector add${where ? ` on ${where}` : ""}`, timing, `at ${fmtTime(r.finished_at)}`].filter(Boolean).join(" · ")));
}

function triageBox() {
  const tri = store.result && !store.result.ok ? store.result.triage : null;
  if (!tri) return null;
  return h("div", { class: "tritonkit-triage", "data-tk": "triage" },
    h("div", {}, h("strong", {}, tri.title), ` [${tri.key}]`),
    tri.error ? h("div", {}, "Error: ", h("code", {}, tri.error)) : null,
    h("div", {}, h("strong", {}, "Fix: "), tri.fix));
}

function factsTable(env) {
  if (!env) return h("div", { class: "tritonkit-muted" }, "Reading the environment…");
  const rows = [];
  const add = (k, v) => rows.push(h("tr", {}, h("th", {}, k), h("td", {}, v ?? "—")));
  const py = env.python || {};
  add("Python", `${py.version || "?"} (${py.kind || "?"})`);
  const t = env.torch || {};
  add("torch", t.version ? `${t.version}${t.cuda ? ` · CUDA ${t.cuda}` : ""}${t.cuda_available ? "" : " · no CUDA device"}` : t.error);
  const tr = env.triton || {};
  const dists = Object.entries(tr.distributions || {}).map(([k, v]) => `${k} ${v}`).join(", ");
  add("Triton", tr.version ? `${tr.version}${dists ? ` (${dists})` : ""}` : (tr.import_error ? `import fails: ${tr.import_error.title}` : dists || "not installed"));
  if (tr.match) add("Match", tr.match.ok ? `matches torch (${tr.match.expected})` : (tr.match.problems || []).join("; "));
  const g = env.gpu || {};
  add("GPU", `${g.name || "none"}${g.cc ? ` (sm${String(g.cc).replace(".", "")})` : ""} · ${g.label || g.class || "?"}`);
  add("fp8 native", g.fp8_native ? "yes" : "no (this pack’s fp8 fallback applies)");
  if (!tr.import_error) add("Triton support", g.triton);
  if (g.tensor_core_dot === false) add("tl.dot", "FMA units, no tensor cores (Triton 3.3+ below sm80): the pack’s attention and fused linear stay off");
  const c = env.c_compiler || {};
  add("C compiler", c.kind ? `${c.kind}${c.path ? ` (${c.path})` : ""}${c.note ? ` — ${c.note}` : ""}` : (c.note || "none"));
  return h("table", { class: "tritonkit-facts", "data-tk": "facts" }, rows);
}

function cachesBlock(env, state) {
  const caches = env?.caches || {};
  const rows = Object.entries(caches).map(([name, c]) =>
    h("tr", {}, h("th", {}, name), h("td", {}, `${c.path} — ${c.exists ? fmtBytes(c.bytes) : "absent"}`)));
  const total = Object.values(caches).reduce((a, c) => a + (c.bytes || 0), 0);
  const parts = [h("h4", {}, "Caches"), h("table", { class: "tritonkit-facts", "data-tk": "caches" }, rows)];
  if (state.confirming) {
    parts.push(h("div", { class: "tritonkit-confirm", "data-tk": "confirm" },
      `Delete everything inside these ${Object.keys(caches).length} folders (${fmtBytes(total)})? Triton and TorchInductor rebuild what they need on the next run (the first run is slower).`,
      h("div", { class: "tritonkit-actions" },
        h("button", { class: "tritonkit-btn tritonkit-danger", "data-tk": "confirm-clear", onclick: () => { state.confirming = false; clearCaches(); } }, "Delete cache contents"),
        h("button", { class: "tritonkit-btn", "data-tk": "cancel-clear", onclick: () => { state.confirming = false; emit(); } }, "Cancel"))));
  } else {
    parts.push(h("div", { class: "tritonkit-actions" },
      h("button", { class: "tritonkit-btn", "data-tk": "clear", disabled: store.clearing || store.running || undefined, onclick: () => { state.confirming = true; emit(); } },
        store.clearing ? "Clearing…" : "Clear caches…")));
  }
  const cr = store.clearResult;
  if (cr) {
    if (cr.error) parts.push(h("div", { class: "tritonkit-error", "data-tk": "clear-result" }, `Clearing failed: ${cr.error}`));
    else {
      const freed = Object.values(cr.cleared || {}).reduce((a, r) => a + (r.removed_bytes || 0), 0);
      const errs = Object.values(cr.cleared || {}).flatMap((r) => r.errors || []);
      parts.push(h("div", { class: errs.length ? "tritonkit-error" : "", "data-tk": "clear-result" },
        `Cleared ${fmtBytes(freed)}.`, errs.length ? ` Not removed: ${errs.join("; ")}` : ""));
    }
  }
  return parts;
}

function renderPanel(root, state) {
  const env = store.status?.environment;
  const running = store.running;
  const children = [
    h("h3", {}, h("i", { class: "pi pi-bolt" }), "Triton"),
    verdict(),
    running ? h("div", { class: "tritonkit-progress", "data-tk": "progress" }, h("div", { class: "tritonkit-bar" })) : null,
    triageBox(),
    h("div", { class: "tritonkit-actions" },
      h("button", { class: "tritonkit-btn tritonkit-primary", "data-tk": "run", disabled: running || undefined, onclick: () => runSelfTest() },
        running ? "Running…" : "Run self-test"),
      h("button", { class: "tritonkit-btn", "data-tk": "refresh", disabled: running || undefined, onclick: () => refreshStatus(true) }, "Refresh")),
    store.error ? h("div", { class: "tritonkit-error", "data-tk": "error" }, store.error) : null,
    h("h4", {}, "Environment"),
    factsTable(env),
    ...cachesBlock(env, state),
    store.result?.text ? h("details", { "data-tk": "report" }, h("summary", {}, "Full report"), h("pre", {}, store.result.text)) : null,
    h("div", { class: "tritonkit-muted" }, h("a", { href: PANEL_README_URL, target: "_blank", rel: "noopener" }, "What this panel checks")),
  ];
  root.replaceChildren(...children.filter(Boolean));
}

function renderTab(el) {
  injectStyle();
  const root = h("div", { class: "tritonkit-panel", "data-tk": "panel" });
  el.replaceChildren(root);
  const state = { confirming: false };
  let timer = null;
  let shown = false; // render() may run before the frontend attaches el to the page
  const update = () => {
    if (root.isConnected) shown = true;
    else if (shown) {
      // the tab was closed without destroy(): stop updating this copy
      store.listeners.delete(update);
      if (timer) clearInterval(timer);
      timer = null;
      return;
    }
    renderPanel(root, state);
    if (store.running && !timer) timer = setInterval(update, 1000);
    if (!store.running && timer) {
      clearInterval(timer);
      timer = null;
    }
  };
  store.listeners.add(update);
  el.__tritonkitUpdate = update;
  update();
  if (!store.status) refreshStatus();
}

function destroyTab() {
  for (const fn of [...store.listeners]) store.listeners.delete(fn);
}

// ----------------------------------------------------------------------------------- nodes

function showTextOnNode(node, text, spec, state) {
  let w = node.widgets?.find((x) => x.name === "tritonkit_text");
  if (!w) {
    if (typeof node.addDOMWidget !== "function") {
      // an older or unusual frontend: a plain text widget still shows the first line
      w = node.addWidget("text", "tritonkit_text", text.split("\n")[0], () => {}, { serialize: false });
      w.serialize = false;
      return;
    }
    injectStyle();
    const ta = h("textarea", { class: "tritonkit-node-text", readonly: true, spellcheck: "false", "data-tk": "node-text" });
    w = node.addDOMWidget("tritonkit_text", "tritonkit_text", ta, { serialize: false, hideOnZoom: false, getValue: () => ta.value, setValue: () => {} });
    w.serialize = false;
    w.computeLayoutSize = () => ({ minHeight: spec.minHeight, minWidth: 300 });
    w.tritonkitElement = ta;
  }
  const el = w.tritonkitElement || w.element;
  if (el) {
    el.value = text;
    el.title = text;
    if (state) el.dataset.state = state;
    else delete el.dataset.state;
  } else {
    w.value = text.split("\n")[0];
  }
  const want = [Math.max(node.size?.[0] ?? 0, spec.minHeight > 100 ? 460 : 320), 0];
  const computed = node.computeSize ? node.computeSize() : [want[0], spec.minHeight + 60];
  want[1] = Math.max(node.size?.[1] ?? 0, computed[1], spec.minHeight + 60);
  node.setSize?.(want);
  node.setDirtyCanvas?.(true, true);
}

function hookNode(nodeType, nodeData) {
  const spec = TEXT_NODES[nodeData?.name];
  if (!spec) return;
  const orig = nodeType.prototype.onExecuted;
  nodeType.prototype.onExecuted = function (message) {
    const ret = orig?.apply(this, arguments);
    try {
      const t = message?.text;
      const text = Array.isArray(t) ? t.join("\n") : t == null ? "" : String(t);
      let state;
      const meta = message?.tritonkit?.[0];
      if (meta) {
        try {
          state = JSON.parse(meta).ok === false ? "fail" : undefined;
        } catch {
          state = undefined;
        }
      }
      if (text) showTextOnNode(this, text, spec, state);
    } catch (e) {
      console.warn("[TritonKit] could not show the node's text", e);
    }
    return ret;
  };
}

// ----------------------------------------------------------------------------------- extension

app.registerExtension({
  name: EXT_NAME,
  settings: [
    {
      id: SETTING_STARTUP,
      name: "Run the Triton self-test when ComfyUI starts",
      category: ["TritonKit", "Self-test", "Run on startup"],
      type: "boolean",
      defaultValue: true,
      tooltip: "Compiles and runs Triton's vector add when the page loads (once per server start) and shows a notice naming the known cause and fix when it fails.",
    },
  ],
  aboutPageBadges: [{ label: "TritonKit", url: README_URL, icon: "pi pi-bolt" }],
  commands: [
    {
      id: "TritonKit.RunSelfTest",
      label: "Run the Triton self-test",
      icon: "pi pi-bolt",
      function: async () => {
        const r = await runSelfTest();
        if (r && !r.ok) toastFailure(r);
        else if (r) toast({ severity: "success", summary: "Triton self-test passed", detail: "Triton compiled and ran the vector add correctly.", life: 4000 });
      },
    },
  ],
  async beforeRegisterNodeDef(nodeType, nodeData) {
    hookNode(nodeType, nodeData);
  },
  async setup() {
    const em = app.extensionManager;
    if (em?.registerSidebarTab) {
      em.registerSidebarTab({
        id: TAB_ID,
        icon: "pi pi-bolt",
        title: "Triton",
        tooltip: "Triton",
        label: "Triton",
        type: "custom",
        render: renderTab,
        destroy: destroyTab,
      });
    }
    api.addEventListener("tritonkit.selftest", () => {
      if (!store.running) refreshStatus();
    });
    startupCheck().catch((e) => console.warn("[TritonKit] startup self-test failed to run", e));
  },
});
