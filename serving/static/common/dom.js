// DOM building for searchrl's pages (issue 51). Every string from the server (passages, model output,
// questions) goes into a text node: nothing here parses HTML, so a passage holding <script> shows as text.

/** An element: `el("div", {class: "x", onclick: f}, "text", child, [more])`. Null children are skipped. */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") node.addEventListener(key.slice(2), value);
    else if (key === "class") node.className = value;
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  append(node, children);
  return node;
}

/** Append strings (as text nodes), numbers, nodes and nested arrays to `node`. */
export function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** Replace everything inside `node` with `children`. */
export function replace(node, ...children) {
  node.replaceChildren();
  return append(node, children);
}

const WORD = /[\p{L}\p{N}]/u;

/** `text` with each case-insensitive whole-word occurrence of `needle` in a <mark class="gold"> (text nodes
 *  only; "art" is not marked inside "party", as the server's token-span check would not count it). */
export function highlight(text, needle) {
  const out = document.createDocumentFragment();
  text = String(text ?? "");
  const lower = text.toLowerCase(), want = String(needle ?? "").toLowerCase();
  let at = 0;
  for (let i = want ? lower.indexOf(want) : -1; i >= 0; i = lower.indexOf(want, i + 1)) {
    const end = i + want.length;
    if (i < at || WORD.test(text[i - 1] ?? "") || WORD.test(text[end] ?? "")) continue;
    out.append(text.slice(at, i), el("mark", {class: "gold"}, text.slice(i, end)));
    at = end;
  }
  out.append(text.slice(at));
  return out;
}

/** A number with `digits` decimals, or "–" for null / undefined / NaN. */
export function num(x, digits = 3) {
  return x === null || x === undefined || Number.isNaN(Number(x)) ? "–" : Number(x).toFixed(digits);
}

/** GET/POST JSON; a non-2xx answer throws an Error whose message is the server's own `detail` (and status). */
export async function getJSON(url, options = {}) {
  const response = await fetch(url, options);
  if (!response.ok) throw await httpError(response);
  return response.json();
}

/** The Error of a failed response: "<status>: <detail>" from the JSON body when there is one. */
export async function httpError(response) {
  let detail = response.statusText;
  try {
    const body = await response.json();
    detail = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail ?? body);
  } catch (e) { /* not JSON: the status text */ }
  const error = new Error(`${response.status}: ${detail}`);
  error.status = response.status;
  return error;
}

/** One retrieved document as a card: title, score, which gold answer it holds, the passage (gold marked). */
export function docCard(doc, index) {
  const gold = doc.gold ?? null;
  return el("li", {class: "doc" + (gold ? " holds-gold" : "")},
    el("div", {class: "doc-head"},
      el("span", {class: "doc-index"}, `Doc ${index}`), " ",
      el("span", {class: "doc-title"}, doc.title || (doc.found === false ? `(not in the corpus: ${doc.id})` : "(untitled)")),
      " ", el("span", {class: "doc-score"}, doc.score === null || doc.score === undefined ? "score: not recorded" : `score ${num(doc.score)}`),
      doc.id ? el("span", {class: "doc-id"}, doc.id) : null,
      gold ? el("span", {class: "badge gold-badge"}, `holds gold: ${gold}`) : null),
    el("div", {class: "doc-text"}, highlight(doc.text, gold)));
}
