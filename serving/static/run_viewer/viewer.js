// The run viewer's page (issue 51): reads /api/* of serving/run_viewer.py and builds the DOM with
// common/dom.js, which puts every string from the run into text nodes.
import {docCard, el, getJSON, num, replace} from "../common/dom.js";

const $ = (id) => document.getElementById(id);
const state = {summary: null, offset: 0, limit: 50, total: 0, filters: {}, question: null, rollout: {step: null, offset: 0}};

function showError(id, error) { $(id).textContent = error ? String(error.message || error) : ""; }

function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== "" && v !== null && v !== undefined) q.set(k, v);
  const s = q.toString();
  return s ? `?${s}` : "";
}

// ------------------------------------------------------------------ episode rendering (shared)

function scoreLine(item) {
  return el("div", {class: "kv"},
    el("span", {}, "EM ", el("b", {class: item.em ? "ok" : "bad"}, num(item.em, 0))),
    el("span", {}, "F1 ", el("b", {}, num(item.f1))),
    item.cover_em !== undefined ? el("span", {}, "cover-EM ", el("b", {}, num(item.cover_em, 0))) : null,
    item.finish_reason ? el("span", {}, "finish ", el("b", {}, item.finish_reason)) : null,
    item.searches !== undefined && item.searches !== null ? el("span", {}, "searches ", el("b", {}, item.searches)) : null);
}

function answerBox(answer, forced) {
  const none = answer === null || answer === undefined || answer === "";
  return el("div", {class: "answer" + (none ? " none" : "")}, el("b", {}, "answer: "),
    none ? "(no answer)" : String(answer), forced ? el("span", {class: "badge"}, "forced") : null);
}

function docList(docs) {
  return el("ol", {class: "docs"}, (docs || []).map((d, i) => docCard(d, i + 1)));
}

export function renderTurns(turns) {
  if (!turns) return el("div", {class: "muted"}, "predictions.jsonl keeps only a baseline's answer (no turns, no documents)");
  if (!turns.length) return el("div", {class: "muted"}, "no turns");
  return el("ol", {class: "turns"}, turns.map((t, i) => el("li", {class: "turn"},
    el("div", {class: "turn-head"}, `Turn ${i + 1} · ${t.action}`,
      t.finish_reason && t.finish_reason !== "stop" ? el("span", {class: "badge"}, `cut: ${t.finish_reason}`) : null),
    t.query !== null && t.query !== undefined ? el("div", {class: "query"}, el("b", {}, "query: "), t.query) : null,
    el("pre", {class: "model"}, t.text ?? ""),
    t.docs && t.docs.length ? docList(t.docs) : null)));
}

function renderEpisode(ep) {
  return el("div", {class: "episode"},
    el("div", {class: "muted"}, `episode #${ep.n} · ${ep.method} (${ep.recipe || "?"}) · ${ep.dataset}`),
    scoreLine(ep),
    el("h3", {}, "Turns"), renderTurns(ep.turns),
    ep.context_docs ? [el("h3", {}, "Documents the generator read"), docList(ep.context_docs)] : null,
    ep.evidence ? [el("h3", {}, "Evidence"), el("pre", {class: "model"}, ep.evidence)] : null,
    answerBox(ep.answer, ep.answer_forced));
}

// ------------------------------------------------------------------ summary

async function loadSummary() {
  const s = await getJSON("/api/run");
  state.summary = s;
  replace($("run-name"), `${s.run} — ${s.path}`);
  replace($("missing"), s.missing.map((m) => el("div", {class: "notice"}, m)));
  const methods = s.eval.methods.map((m) => m.method);
  for (const m of methods) $("f-method").append(el("option", {value: m}, m));
  for (const d of s.eval.datasets) $("f-dataset").append(el("option", {value: d}, d));
  for (const id of ["sbs-a", "sbs-b"]) replace($(id), methods.map((m) => el("option", {value: m}, m)));
  if (s.eval.methods.length) {
    replace($("methods-table"), el("table", {},
      el("thead", {}, el("tr", {}, el("th", {}, "method"), el("th", {class: "n"}, "episodes"),
        el("th", {class: "n"}, "EM"), el("th", {class: "n"}, "F1"), el("th", {class: "n"}, "cover-EM"),
        el("th", {class: "n"}, "own searches/q"), el("th", {class: "n"}, "retrieval recall"),
        el("th", {class: "n"}, "context recall"))),
      el("tbody", {}, s.eval.methods.map((m) => el("tr", {}, el("td", {}, m.method), el("td", {class: "n"}, m.episodes),
        el("td", {class: "n"}, num(m.em)), el("td", {class: "n"}, num(m.f1)), el("td", {class: "n"}, num(m.cover_em)),
        el("td", {class: "n"}, m.own_searches == null ? "–" : num(m.own_searches)),
        el("td", {class: "n"}, m.retrieval_recall == null ? "–" : num(m.retrieval_recall)),
        el("td", {class: "n"}, m.context_recall == null ? "–" : num(m.context_recall)))))));
  }
  replace($("r-step"), s.steps.map((st) => el("option", {value: st.step},
    `step ${st.step}` + (st["rollout/reward_mean"] !== undefined ? ` (reward ${num(st["rollout/reward_mean"])})` : ""))));
  renderCurves(s);
}

function renderCurves(s) {
  if (!s.dev_curve.length) replace($("dev-curve"), el("div", {class: "muted"}, "no dev evaluation in metrics.jsonl"));
  else replace($("dev-curve"), el("table", {},
    el("thead", {}, el("tr", {}, ["step", "question visits", "F1", "cover-EM", "EM", "answered", "questions"]
      .map((h) => el("th", {class: "n"}, h)))),
    el("tbody", {}, s.dev_curve.map((r) => el("tr", {},
      el("td", {class: "n"}, num(r.step, 0)), el("td", {class: "n"}, num(r.visits, 0)), el("td", {class: "n"}, num(r.F1)),
      el("td", {class: "n"}, num(r["cover-EM"])), el("td", {class: "n"}, num(r.EM)), el("td", {class: "n"}, num(r.answered, 2)),
      el("td", {class: "n"}, num(r.questions, 0)))))));
  replace($("reward-curves"), s.reward_curves
    ? el("img", {src: "/reward_curves.png", alt: "reward curves of the run"})
    : el("div", {class: "muted"}, "the run has no reward_curves.png yet (drawn when training ends)"));
}

// ------------------------------------------------------------------ episodes list

async function loadEpisodes() {
  showError("episodes-error", null);
  const q = {...state.filters, offset: state.offset, limit: state.limit};
  let page;
  try {
    page = await getJSON(`/api/episodes${query(q)}`);
  } catch (e) {
    showError("episodes-error", e);
    replace($("episodes-table").tBodies[0]);
    replace($("episodes-count"));
    return;
  }
  state.total = page.total;
  const last = Math.min(page.offset + page.items.length, page.total);
  replace($("episodes-count"), page.total ? `episodes ${page.offset + 1}–${last} of ${page.total}` : "no episode matches");
  replace($("episodes-table").tBodies[0], page.items.map((e) => el("tr", {class: "pick", "data-n": e.n, onclick: () => pick(e)},
    el("td", {}, e.n), el("td", {}, e.method), el("td", {}, e.dataset), el("td", {class: "q"}, e.question),
    el("td", {}, e.answer ?? "(none)"), el("td", {}, (e.golden_answers || []).join(" | ")),
    el("td", {class: "n"}, num(e.em, 0)), el("td", {class: "n"}, num(e.f1)), el("td", {class: "n"}, e.searches ?? "–"),
    el("td", {class: "n"}, e.own_searches ?? "–"),
    el("td", {}, e.retrieval_hit == null ? "–" : (e.retrieval_hit ? "yes" : "no")),
    el("td", {}, e.finish_reason ?? ""))));
  $("ep-prev").disabled = state.offset === 0;
  $("ep-next").disabled = last >= page.total;
}

function pick(item) {
  for (const row of $("episodes-table").tBodies[0].rows) row.classList.toggle("selected", row.dataset.n === String(item.n));
  const methods = state.summary.eval.methods.map((m) => m.method);
  const other = ["untrained", "naive_rag", "policy", ...methods].find((m) => m !== item.method && methods.includes(m));
  $("sbs-a").value = item.method;
  if (other) $("sbs-b").value = other;
  state.question = {id: item.qid, dataset: item.dataset};
  loadQuestion().then(() => $("side-by-side").scrollIntoView({behavior: "instant", block: "start"}));
}

// ------------------------------------------------------------------ side by side

async function loadQuestion() {
  if (!state.question) return;
  showError("sbs-error", null);
  let q;
  try {
    q = await getJSON(`/api/question${query(state.question)}`);
  } catch (e) {
    showError("sbs-error", e);
    return;
  }
  $("sbs-hint").hidden = true;
  $("sbs-controls").hidden = false;
  replace($("sbs-question"), el("div", {class: "kv"}, el("b", {}, "question: "), q.question),
    el("div", {class: "kv"}, el("b", {}, "gold: "), q.golden_answers.join(" | "),
      el("span", {class: "muted"}, `  (${q.dataset}, id ${q.qid})`)));
  for (const [side, select] of [["sbs-left", "sbs-a"], ["sbs-right", "sbs-b"]]) {
    const method = $(select).value;
    const episodes = q.methods[method] || [];
    replace($(side), el("h3", {}, method),
      episodes.length ? episodes.map(renderEpisode) : el("div", {class: "muted"}, `${method} has no episode of this question`));
  }
}

// ------------------------------------------------------------------ training rollouts

async function loadRollouts() {
  showError("rollouts-error", null);
  const step = $("r-step").value;
  if (!step) { replace($("rollouts-list"), el("div", {class: "muted"}, "the run has no training rollouts")); return; }
  const limit = Number($("r-limit").value);
  let page;
  try {
    page = await getJSON(`/api/steps/${encodeURIComponent(step)}/rollouts${query({offset: state.rollout.offset, limit})}`);
  } catch (e) {
    showError("rollouts-error", e);
    return;
  }
  const last = Math.min(page.offset + page.items.length, page.total);
  replace($("rollouts-count"), `step ${page.step}: rollouts ${page.total ? page.offset + 1 : 0}–${last} of ${page.total}`);
  $("r-prev").disabled = page.offset === 0;
  $("r-next").disabled = last >= page.total;
  replace($("rollouts-list"), page.items.map((r) => el("div", {class: "rollout"},
    el("div", {}, el("b", {}, r.question), el("span", {class: "muted"}, `  sample ${r.sample_index} · ${r.qid}`)),
    el("div", {class: "kv"}, el("b", {}, "gold: "), r.golden_answers.join(" | ")),
    el("div", {class: "kv"}, el("span", {}, "reward ", el("b", {}, num(r.reward))),
      el("span", {}, "EM ", el("b", {}, num(r.em, 0))), el("span", {}, "F1 ", el("b", {}, num(r.f1))),
      el("span", {}, "finish ", el("b", {}, r.finish_reason ?? ""))),
    Object.keys(r.reward_components).length ? el("table", {class: "components"},
      el("thead", {}, el("tr", {}, Object.keys(r.reward_components).map((k) => el("th", {class: "n"}, k)))),
      el("tbody", {}, el("tr", {}, Object.values(r.reward_components).map((v) => el("td", {class: "n"}, num(v))))))
      : null,
    el("h3", {}, "Turns"), renderTurns(r.turns),
    r.selected_docs && r.selected_docs.length ? [el("h3", {}, "Selected documents"), docList(r.selected_docs)] : null,
    answerBox(r.answer, r.answer_forced))));
}

// ------------------------------------------------------------------ wiring

function readFilters() {
  return {method: $("f-method").value, dataset: $("f-dataset").value, f1_min: $("f-f1-min").value, f1_max: $("f-f1-max").value};
}

async function start() {
  try {
    await loadSummary();
  } catch (e) {
    showError("page-error", e);
    return;
  }
  if (state.summary.eval.methods.some((m) => m.method === "policy")) {  // the trained searcher's episodes first
    $("f-method").value = "policy";
    state.filters = readFilters();
  }
  $("filters").addEventListener("submit", (ev) => { ev.preventDefault(); state.filters = readFilters(); state.offset = 0; loadEpisodes(); });
  $("ep-prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - state.limit); loadEpisodes(); });
  $("ep-next").addEventListener("click", () => { state.offset += state.limit; loadEpisodes(); });
  for (const id of ["sbs-a", "sbs-b"]) $(id).addEventListener("change", loadQuestion);
  $("rollout-form").addEventListener("submit", (ev) => { ev.preventDefault(); state.rollout.offset = 0; loadRollouts(); });
  $("r-prev").addEventListener("click", () => { state.rollout.offset = Math.max(0, state.rollout.offset - Number($("r-limit").value)); loadRollouts(); });
  $("r-next").addEventListener("click", () => { state.rollout.offset += Number($("r-limit").value); loadRollouts(); });
  await Promise.all([loadEpisodes(), loadRollouts()]);
  document.body.dataset.ready = "1";  // for tests and scripts: the first page of each part is shown
}

start();
