// The searcher's playground (issue 51): asks POST /v1/search/stream and shows each server-sent event
// as it arrives. Every string from the server goes into text nodes (common/dom.js).
import {docCard, el, getJSON, httpError, num, replace} from "../common/dom.js";

const $ = (id) => document.getElementById(id);
let controller = null;

function headers() {
  const token = $("token").value.trim();
  return token ? {Authorization: `Bearer ${token}`} : {};
}

function showError(message) { $("error").textContent = message || ""; }

async function loadLimits() {
  try {
    const limits = await getJSON("v1/limits", {headers: headers()});
    $("topk").min = 1; $("topk").max = limits.max_topk;
    $("max_turns").min = 0; $("max_turns").max = limits.max_turns;
    $("temperature").min = limits.temperature[0]; $("temperature").max = limits.temperature[1];
    replace($("limits"), `limits: top-k 1..${limits.max_topk}, turns 0..${limits.max_turns}, ` +
      `temperature ${limits.temperature[0]}..${limits.temperature[1]}, deadline ${limits.max_timeout_s} s; blank = the server's default`);
    replace($("model"), `${limits.model.name} (${limits.model.recipe}` + (limits.model.step !== null ? `, step ${limits.model.step}` : "") + ")");
    showError("");
  } catch (e) {
    replace($("limits"));
    showError(e.status === 401 ? `${e.message} (enter the token)` : e.message);
  }
}

function body() {
  const out = {question: $("question").value};
  for (const id of ["topk", "max_turns", "temperature"]) {
    const raw = $(id).value.trim();
    if (raw !== "") out[id] = Number(raw);  // the endpoint checks the range and says what it expects
  }
  return out;
}

function turnItem(turn, index, seconds) {
  return el("li", {class: "turn"},
    el("div", {class: "turn-head"}, `Turn ${index} · ${turn.action}`, el("span", {class: "elapsed"}, `+${seconds.toFixed(1)} s`)),
    turn.query !== null && turn.query !== undefined ? el("div", {class: "query"}, el("b", {}, "query: "), turn.query) : null,
    turn.text ? el("pre", {class: "model"}, turn.text) : null,
    turn.docs && turn.docs.length ? el("ol", {class: "docs"}, turn.docs.map((d, i) => docCard(d, i + 1))) : null);
}

function answerBlock(r) {
  const none = r.answer === null || r.answer === undefined || r.answer === "";
  const u = r.usage, t = r.timings;
  return [
    el("div", {class: "answer" + (none ? " none" : "")}, el("b", {}, "answer: "), none ? "(no answer)" : r.answer),
    el("div", {class: "kv"},
      el("span", {}, "finish ", el("b", {}, r.finish_reason)),
      el("span", {}, "tokens: prompt ", el("b", {}, u.prompt_tokens), ", generated ", el("b", {}, u.completion_tokens),
        ", observations ", el("b", {}, u.observation_tokens)),
      el("span", {}, "searches ", el("b", {}, u.searches))),
    el("div", {class: "kv"},
      el("span", {}, "seconds: total ", el("b", {}, num(t.total_s, 2))), el("span", {}, "queue ", el("b", {}, num(t.queue_s, 2))),
      el("span", {}, "generate ", el("b", {}, num(t.generate_s, 2))), el("span", {}, "search ", el("b", {}, num(t.search_s, 2))))];
}

/** Yield [event, data] of a server-sent-event stream (`event: x` / `data: {...}` blocks). */
async function* events(response) {
  const reader = response.body.getReader(), decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    buffer += decoder.decode(value || new Uint8Array(), {stream: !done});
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let kind = "message", data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) kind = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      yield [kind, data ? JSON.parse(data) : {}];
    }
    if (done) return;
  }
}

async function ask(ev) {
  ev.preventDefault();
  showError("");
  replace($("turns"));
  replace($("answer"));
  controller = new AbortController();
  $("ask-button").disabled = true;
  $("stop").disabled = false;
  const t0 = performance.now();
  const seconds = () => (performance.now() - t0) / 1000;
  replace($("status"), "asking…");
  let turns = 0;
  try {
    const response = await fetch("v1/search/stream", {
      method: "POST", signal: controller.signal, body: JSON.stringify(body()),
      headers: {"Content-Type": "application/json", ...headers()}});
    if (!response.ok) throw await httpError(response);
    for await (const [kind, data] of events(response)) {
      if (kind === "turn") {
        turns += 1;
        $("turns").append(turnItem(data, turns, seconds()));
        if (turns === 1) replace($("status"), `first turn after ${seconds().toFixed(1)} s…`);
      } else if (kind === "answer") {
        replace($("answer"), answerBlock(data));
      } else if (kind === "error") {
        throw new Error(`${data.error?.code ?? "error"}: ${data.detail ?? data.error?.message}`);
      } else if (kind === "done") {
        replace($("status"), `done: ${turns} turn(s) in ${seconds().toFixed(1)} s`);
      }
    }
  } catch (e) {
    if (e.name === "AbortError") replace($("status"), `stopped after ${seconds().toFixed(1)} s`);
    else { showError(e.message); replace($("status")); }
  } finally {
    $("ask-button").disabled = false;
    $("stop").disabled = true;
    controller = null;
  }
}

$("ask").addEventListener("submit", ask);
$("stop").addEventListener("click", () => controller && controller.abort());
$("token").addEventListener("change", loadLimits);
loadLimits().then(() => { document.body.dataset.ready = "1"; });
