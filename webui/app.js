// kiln web UI — chat with the served model through the OpenAI-compatible API.
// Plain browser JavaScript, no build step. Optional libraries (inlined before this file when the
// Debian packages were present at build time): markdown-it (window.markdownit), highlight.js
// (window.hljs), KaTeX (window.katex). Without them replies are shown as plain text.
// Model output never reaches innerHTML unescaped: markdown-it runs with html:false (raw HTML is
// shown as text, unsafe link schemes are refused), images in Markdown are disabled, and math is
// rendered by KaTeX (trust:false) as MathML.
'use strict';
(function () {
  const $ = (id) => document.getElementById(id);
  const KEYS = { convs: 'kiln.conversations', current: 'kiln.current', settings: 'kiln.settings' };
  const ICON_TRASH = '<svg width="14" height="14" viewBox="0 0 16 16" fill="none" stroke="currentColor" stroke-width="1.5" ' +
    'aria-hidden="true"><path d="M2.5 4h11M6 4V2.5h4V4M4 4l.7 9.5h6.6L12 4M6.5 6.5v5M9.5 6.5v5"/></svg>';
  const DEFAULTS = { apiKey: '', system: '', temperature: '', top_p: '', max_tokens: '', thinking: true, extra: '' };

  // ---------------------------------------------------------------------------------------------
  // State

  function load(key, fallback) {
    try {
      const v = JSON.parse(localStorage.getItem(key));
      return v == null ? fallback : v;
    } catch (e) {
      return fallback;
    }
  }
  let settings = Object.assign({}, DEFAULTS, load(KEYS.settings, {}));
  let convs = load(KEYS.convs, []);
  if (!Array.isArray(convs)) convs = [];
  let currentId = localStorage.getItem(KEYS.current);
  if (!convs.some((c) => c.id === currentId)) currentId = null;
  const server = { alias: '', nCtx: 0, vision: false, imageMaxPixels: 0, ok: false };
  let busy = null;           // { controller, conv, msg } while a reply streams
  let pendingImages = [];    // data: URLs attached to the next message
  let editing = false;       // the last user message is being edited

  // Messages that were streaming when the page went away are finished now.
  for (const c of convs)
    for (const m of c.messages || [])
      if (m.status === 'streaming') m.status = 'stopped';

  function saveConvs() {
    try {
      localStorage.setItem(KEYS.convs, JSON.stringify(convs));
      if (currentId) localStorage.setItem(KEYS.current, currentId);
      else localStorage.removeItem(KEYS.current);
    } catch (e) {
      showError('Could not save the conversations in this browser (' + e.name + '): storage is full. ' +
                'Delete old conversations or large images.');
    }
  }
  function saveSettings() { localStorage.setItem(KEYS.settings, JSON.stringify(settings)); }
  function current() { return convs.find((c) => c.id === currentId) || null; }
  function newId() { return Date.now().toString(36) + Math.random().toString(36).slice(2, 8); }

  // ---------------------------------------------------------------------------------------------
  // Rendering Markdown, code and math

  function escapeHtml(s) {
    return String(s).replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c]));
  }

  function highlight(code, lang) {
    let body = null;
    if (window.hljs && lang && window.hljs.getLanguage(lang)) {
      try {
        const v = parseInt(window.hljs.versionString || '9', 10);
        body = v >= 11 ? window.hljs.highlight(code, { language: lang, ignoreIllegals: true }).value
                       : window.hljs.highlight(lang, code, true).value;
      } catch (e) {
        body = null;
      }
    }
    return '<pre class="code"><div class="code-head"><span>' + escapeHtml(lang || 'text') +
           '</span><button type="button" class="copy-code">copy</button></div><code class="hljs">' +
           (body == null ? escapeHtml(code) : body) + '</code></pre>\n';
  }

  function renderTex(tex, display) {
    try {
      return window.katex.renderToString(tex, { displayMode: display, output: 'mathml', throwOnError: false, trust: false });
    } catch (e) {
      return '<code>' + escapeHtml(tex) + '</code>';
    }
  }

  // Inline math: $…$, $$…$$, \(…\), \[…\] (display). A single $ must hug its content and not be
  // followed by a digit, so prices ("$5 and $6") stay text.
  function mathPlugin(md) {
    md.inline.ruler.before('escape', 'math', function (state, silent) {
      const s = state.src, p = state.pos;
      let open, close, display;
      if (s.startsWith('$$', p)) { open = '$$'; close = '$$'; display = true; }
      else if (s.startsWith('\\[', p)) { open = '\\['; close = '\\]'; display = true; }
      else if (s.startsWith('\\(', p)) { open = '\\('; close = '\\)'; display = false; }
      else if (s[p] === '$') { open = '$'; close = '$'; display = false; }
      else return false;
      const start = p + open.length;
      let end = start;
      for (;;) {
        end = s.indexOf(close, end);
        if (end < 0) return false;
        if (open === '$' && s[end - 1] === '\\') { end += 1; continue; }
        break;
      }
      const tex = s.slice(start, end);
      if (!tex.trim()) return false;
      if (open === '$' && (/^\s/.test(tex) || /\s$/.test(tex) || /[0-9]/.test(s[end + 1] || ''))) return false;
      if (!silent) {
        const t = state.push('math', '', 0);
        t.content = tex;
        t.meta = { display: display };
      }
      state.pos = end + close.length;
      return true;
    });
    md.renderer.rules.math = (tokens, i) => renderTex(tokens[i].content, tokens[i].meta.display);
  }

  let md = null;
  if (window.markdownit) {
    md = window.markdownit({ html: false, linkify: false, typographer: false, breaks: false, highlight: highlight });
    md.disable('image');  // no requests to addresses chosen by model output
    if (window.katex) md.use(mathPlugin);
    const linkOpen = md.renderer.rules.link_open || ((t, i, o, e, self) => self.renderToken(t, i, o));
    md.renderer.rules.link_open = function (tokens, i, opts, env, self) {
      tokens[i].attrSet('target', '_blank');
      tokens[i].attrSet('rel', 'noopener noreferrer');
      return linkOpen(tokens, i, opts, env, self);
    };
  }

  // Markdown → sanitized HTML (the only path by which model text reaches innerHTML).
  function renderMarkdown(text) {
    if (!md) return escapeHtml(text);
    try {
      return md.render(text);
    } catch (e) {
      return escapeHtml(text);
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Server: /props, auth, chat streaming

  function headers(json) {
    const h = {};
    if (json) h['Content-Type'] = 'application/json';
    if (settings.apiKey) h['Authorization'] = 'Bearer ' + settings.apiKey;
    return h;
  }

  async function errorText(resp) {
    let text = '';
    try { text = await resp.text(); } catch (e) { /* ignore */ }
    try {
      const j = JSON.parse(text);
      if (j && j.error) return j.error.message || JSON.stringify(j.error);
    } catch (e) { /* not JSON */ }
    return text || resp.statusText;
  }

  function needKey(why) {
    openSettings(why || 'The server requires an API key. Enter it here; it is kept in this browser only.');
  }

  async function loadServerInfo() {
    $('server-state').textContent = '';
    try {
      const r = await fetch('props', { headers: headers(false) });
      if (r.status === 401) {
        $('model-name').textContent = 'API key needed';
        needKey();
        return;
      }
      if (r.status === 503) {  // still loading the model
        $('model-name').textContent = 'loading the model\u2026';
        setTimeout(() => loadServerInfo().then(renderControls), 1000);
        return;
      }
      if (!r.ok) throw new Error('GET /props: ' + r.status + ' ' + (await errorText(r)));
      const p = await r.json();
      server.alias = p.model_alias || (p.model_path || '').split('/').pop() || 'model';
      const dgs = p.default_generation_settings || {};
      server.nCtx = p.n_ctx_slot || dgs.n_ctx || p.n_ctx || 0;
      server.vision = !!(p.modalities && p.modalities.vision);
      server.imageMaxPixels = Number(p.image_max_pixels) || 0;
      server.ok = true;
    } catch (e) {
      // Older or other servers: the model list still names the model.
      try {
        const r = await fetch('v1/models', { headers: headers(false) });
        if (r.status === 401) { needKey(); return; }
        const j = await r.json();
        server.alias = (j.data && j.data[0] && j.data[0].id) || 'model';
        server.ok = true;
      } catch (e2) {
        $('model-name').textContent = 'server unreachable';
        showError('Cannot reach the server: ' + e.message);
        return;
      }
    }
    $('model-name').textContent = server.alias;
    $('model-name').title = 'model: ' + server.alias;
    $('model-ctx').textContent = server.nCtx ? 'ctx ' + server.nCtx.toLocaleString('en-US') : '';
    $('attach').hidden = !server.vision;
    document.title = server.alias + ' · kiln';
  }

  // Parses a text/event-stream body into JSON objects; stops at "data: [DONE]".
  async function* sseEvents(resp) {
    const reader = resp.body.getReader();
    const dec = new TextDecoder();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true }).replace(/\r\n?/g, '\n');
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const block = buf.slice(0, i);
        buf = buf.slice(i + 2);
        const data = block.split('\n').filter((l) => l.startsWith('data:'))
                          .map((l) => l.slice(5).replace(/^ /, '')).join('\n');
        if (!data) continue;  // comments (keep-alives)
        if (data === '[DONE]') return;
        yield JSON.parse(data);
      }
    }
  }

  function requestBody(conv) {
    const messages = [];
    if (settings.system && settings.system.trim()) messages.push({ role: 'system', content: settings.system });
    for (const m of conv.messages) {
      if (m.role === 'user') {
        if (m.images && m.images.length) {
          const parts = [{ type: 'text', text: m.content }];
          for (const url of m.images) parts.push({ type: 'image_url', image_url: { url: url } });
          messages.push({ role: 'user', content: parts });
        } else {
          messages.push({ role: 'user', content: m.content });
        }
      } else if (m.role === 'assistant' && m.status !== 'error' && m.status !== 'streaming') {
        messages.push({ role: 'assistant', content: m.content || '' });
      }
    }
    const body = { messages: messages, stream: true, chat_template_kwargs: { enable_thinking: !!settings.thinking } };
    const num = (v) => (v === '' || v == null || isNaN(Number(v)) ? null : Number(v));
    if (num(settings.temperature) != null) body.temperature = num(settings.temperature);
    if (num(settings.top_p) != null) body.top_p = num(settings.top_p);
    if (num(settings.max_tokens) != null && num(settings.max_tokens) > 0) body.max_tokens = Math.floor(num(settings.max_tokens));
    const extra = parseExtra(settings.extra);
    if (extra.ok) Object.assign(body, extra.value);
    return body;
  }

  // The "extra request fields" setting: '' or a JSON object.
  function parseExtra(text) {
    if (!text || !text.trim()) return { ok: true, value: {} };
    try {
      const v = JSON.parse(text);
      if (v && typeof v === 'object' && !Array.isArray(v)) return { ok: true, value: v };
      return { ok: false, error: 'must be a JSON object, like {"top_k": 20}' };
    } catch (e) {
      return { ok: false, error: e.message };
    }
  }

  async function generate(conv) {
    const msg = { role: 'assistant', content: '', reasoning: '', status: 'streaming', timings: null };
    const body = requestBody(conv);
    conv.messages.push(msg);
    conv.updated = Date.now();
    const controller = new AbortController();
    busy = { controller: controller, conv: conv, msg: msg };
    hideError();
    saveConvs();
    renderAll();
    try {
      const resp = await fetch('v1/chat/completions', {
        method: 'POST', headers: headers(true), body: JSON.stringify(body), signal: controller.signal,
      });
      if (!resp.ok) {
        const text = await errorText(resp);
        if (resp.status === 401) needKey('The server refused the request (401: ' + text + '). Enter the API key.');
        throw new Error(resp.status + ': ' + text);
      }
      for await (const ev of sseEvents(resp)) {
        if (ev.error) throw new Error(ev.error.message || JSON.stringify(ev.error));
        const ch = ev.choices && ev.choices[0];
        if (ch && ch.delta) {
          if (ch.delta.reasoning_content) msg.reasoning += ch.delta.reasoning_content;
          if (ch.delta.content) msg.content += ch.delta.content;
        }
        if (ch && ch.finish_reason) msg.finish = ch.finish_reason;
        if (ev.timings) msg.timings = ev.timings;
        scheduleStreamRender();
      }
      msg.status = 'done';
    } catch (e) {
      if (e.name === 'AbortError') {
        msg.status = 'stopped';
      } else {
        msg.status = 'error';
        msg.error = String(e.message || e);
        showError(msg.error);
      }
    } finally {
      busy = null;
      conv.updated = Date.now();
      saveConvs();
      renderAll();
    }
  }

  function stop() {
    if (busy) busy.controller.abort();
  }

  // ---------------------------------------------------------------------------------------------
  // Views

  function showError(text) {
    $('error').textContent = text;
    $('error').hidden = false;
  }
  function hideError() { $('error').hidden = true; }

  function renderConvList() {
    const ul = $('conv-list');
    ul.textContent = '';
    const sorted = convs.slice().sort((a, b) => (b.updated || 0) - (a.updated || 0));
    for (const c of sorted) {
      const li = document.createElement('li');
      li.dataset.id = c.id;
      if (c.id === currentId) li.classList.add('active');
      const title = document.createElement('button');
      title.type = 'button';
      title.className = 'conv-title';
      title.textContent = c.title || 'New chat';
      title.title = c.title || 'New chat';
      title.addEventListener('click', () => switchTo(c.id));
      const actions = document.createElement('span');
      actions.className = 'conv-actions';
      const ren = document.createElement('button');
      ren.type = 'button';
      ren.className = 'link rename';
      ren.title = 'Rename';
      ren.setAttribute('aria-label', 'Rename');
      ren.textContent = '\u270E';
      ren.addEventListener('click', () => renameConv(c.id));
      const del = document.createElement('button');
      del.type = 'button';
      del.className = 'link delete';
      del.title = 'Delete';
      del.setAttribute('aria-label', 'Delete');
      del.innerHTML = ICON_TRASH;
      del.addEventListener('click', () => deleteConv(c.id));
      actions.append(ren, del);
      li.append(title, actions);
      ul.append(li);
    }
  }

  function timingsText(t) {
    if (!t) return '';
    const f = (x) => (x >= 100 ? x.toFixed(0) : x.toFixed(1));
    const parts = [];
    parts.push('prompt ' + t.prompt_n + ' tok' + (t.prompt_n > 0 ? ' · ' + f(t.prompt_per_second || 0) + ' tok/s' : ''));
    parts.push('gen ' + t.predicted_n + ' tok · ' + f(t.predicted_per_second || 0) + ' tok/s');
    if (t.cache_n > 0) parts.push('cache hit ' + t.cache_n + ' tok');
    return parts.join(' | ');
  }

  function fillAssistant(el, msg) {
    const streaming = msg.status === 'streaming';
    el.classList.toggle('streaming', streaming);
    const bubble = el.querySelector('.bubble');
    let det = bubble.querySelector('details.thinking');
    if (msg.reasoning) {
      if (!det) {
        det = document.createElement('details');
        det.className = 'thinking';
        det.innerHTML = '<summary></summary><div class="thinking-body"></div>';
        // 'toggle' also fires (later) for changes made here: only a differing state is the user's.
        det._auto = det.open = streaming && !msg.content;
        det.addEventListener('toggle', () => { if (det.open !== det._auto) det.dataset.userToggled = '1'; });
        bubble.prepend(det);
      }
      if (!det.dataset.userToggled && streaming && msg.content && det.open) {
        det._auto = det.open = false;  // the answer started: fold the thinking away
      }
      det.querySelector('summary').textContent = streaming && !msg.content ? 'Thinking\u2026'
        : 'Thinking (' + msg.reasoning.length.toLocaleString('en-US') + ' characters)';
      const tb = det.querySelector('.thinking-body');
      const follow = tb.scrollHeight - tb.scrollTop - tb.clientHeight < 40;
      tb.textContent = msg.reasoning;
      tb.classList.toggle('cursor', streaming && !msg.content);
      if (streaming && follow) tb.scrollTop = tb.scrollHeight;
    } else if (det) {
      det.remove();
    }
    const content = bubble.querySelector('.content');
    content.innerHTML = renderMarkdown(msg.content || '');
    content.classList.toggle('plain', !md);
    let cursor = content.querySelector('.cursor-end');
    if (streaming && (msg.content || !msg.reasoning)) {
      if (!cursor) {
        cursor = document.createElement('span');
        cursor.className = 'cursor cursor-end';
        content.append(cursor);
      }
    }
    const meta = el.querySelector('.meta');
    const tim = meta.querySelector('.timings');
    tim.textContent = timingsText(msg.timings);
    const st = meta.querySelector('.status');
    st.className = 'status';
    if (msg.status === 'stopped') st.textContent = 'stopped';
    else if (msg.status === 'error') { st.textContent = 'error: ' + (msg.error || ''); st.classList.add('status-error'); }
    else if (msg.finish === 'length') st.textContent = 'cut at max tokens';
    else st.textContent = '';
  }

  function actionButton(cls, label, fn) {
    const b = document.createElement('button');
    b.type = 'button';
    b.className = 'link ' + cls;
    b.textContent = label;
    b.addEventListener('click', fn);
    return b;
  }

  function messageElement(conv, msg, idx) {
    const el = document.createElement('div');
    el.className = 'msg ' + msg.role;
    el.dataset.index = String(idx);
    const bubble = document.createElement('div');
    bubble.className = 'bubble';
    el.append(bubble);
    const meta = document.createElement('div');
    meta.className = 'meta';
    const last = idx === conv.messages.length - 1;
    const lastUser = msg.role === 'user' && conv.messages.slice(idx + 1).every((m) => m.role !== 'user');
    if (msg.role === 'user') {
      if (editing && lastUser && !busy) {
        const box = document.createElement('div');
        box.className = 'edit-box';
        const ta = document.createElement('textarea');
        ta.value = msg.content;
        const row = document.createElement('div');
        row.className = 'row';
        row.append(actionButton('cancel-edit', 'Cancel', () => { editing = false; renderMessages(); }),
                   actionButton('save-edit primary', 'Send', () => submitEdit(conv, idx, ta.value)));
        ta.addEventListener('keydown', (e) => {
          if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); submitEdit(conv, idx, ta.value); }
          if (e.key === 'Escape') { editing = false; renderMessages(); }
        });
        box.append(ta, row);
        el.replaceChild(box, bubble);
        setTimeout(() => ta.focus(), 0);
      } else {
        bubble.textContent = msg.content;
        if (msg.images && msg.images.length) {
          const imgs = document.createElement('div');
          imgs.className = 'images';
          for (const url of msg.images) {
            if (!/^data:image\//.test(url)) continue;
            const img = document.createElement('img');
            img.src = url;
            img.alt = 'attached image';
            imgs.append(img);
          }
          el.append(imgs);
        }
        if (lastUser && !busy) meta.append(actionButton('edit', 'edit', () => { editing = true; renderMessages(); }));
      }
    } else {
      const content = document.createElement('div');
      content.className = 'content md';
      bubble.append(content);
      const st = document.createElement('span');
      st.className = 'status';
      const tim = document.createElement('span');
      tim.className = 'timings';
      meta.append(tim, st);
      if (msg.status !== 'streaming') {
        meta.append(actionButton('copy', 'copy', () => copyText(msg.content)));
        if (last && !busy) meta.append(actionButton('regenerate', 'regenerate', () => regenerate(conv)));
      }
      el.append(meta);
      fillAssistant(el, msg);
      return el;
    }
    el.append(meta);
    return el;
  }

  function nearBottom() {
    const box = $('messages');
    return box.scrollHeight - box.scrollTop - box.clientHeight < 80;
  }
  function scrollToBottom() {
    const box = $('messages');
    box.scrollTop = box.scrollHeight;
  }

  function renderMessages() {
    const box = $('messages');
    const conv = current();
    for (const el of Array.from(box.querySelectorAll('.msg'))) el.remove();
    const empty = !conv || conv.messages.length === 0;
    $('empty').hidden = !empty;
    if (!empty) conv.messages.forEach((m, i) => box.append(messageElement(conv, m, i)));
    scrollToBottom();
  }

  function renderControls() {
    const streaming = !!busy;
    $('send').hidden = streaming;
    $('stop').hidden = !streaming;
    $('attach').hidden = !server.vision;
    const ai = $('attachments');
    ai.textContent = '';
    pendingImages.forEach((url, i) => {
      const d = document.createElement('div');
      d.className = 'thumb';
      const img = document.createElement('img');
      img.src = url;
      img.alt = 'attachment';
      const rm = document.createElement('button');
      rm.type = 'button';
      rm.textContent = '\u00D7';
      rm.setAttribute('aria-label', 'Remove the image');
      rm.addEventListener('click', () => { pendingImages.splice(i, 1); renderControls(); });
      d.append(img, rm);
      ai.append(d);
    });
  }

  function renderAll() {
    renderConvList();
    renderMessages();
    renderControls();
  }

  let streamFrame = 0;
  function scheduleStreamRender() {
    if (streamFrame) return;
    streamFrame = requestAnimationFrame(() => {
      streamFrame = 0;
      if (!busy || busy.conv.id !== currentId) return;
      const els = $('messages').querySelectorAll('.msg');
      const el = els[els.length - 1];
      if (!el || !el.classList.contains('assistant')) return;
      const pin = nearBottom();
      fillAssistant(el, busy.msg);
      if (pin) scrollToBottom();
    });
  }

  // ---------------------------------------------------------------------------------------------
  // Actions

  function send() {
    const text = $('input').value;
    if (busy || (!text.trim() && pendingImages.length === 0)) return;
    let conv = current();
    if (!conv) {
      conv = { id: newId(), title: '', created: Date.now(), updated: Date.now(), messages: [] };
      convs.push(conv);
      currentId = conv.id;
    }
    if (!conv.title) conv.title = text.trim().replace(/\s+/g, ' ').slice(0, 60) || 'Image';
    const m = { role: 'user', content: text };
    if (pendingImages.length) m.images = pendingImages.slice();
    conv.messages.push(m);
    pendingImages = [];
    editing = false;
    $('input').value = '';
    autosize();
    generate(conv);
  }

  function regenerate(conv) {
    if (busy) return;
    while (conv.messages.length && conv.messages[conv.messages.length - 1].role === 'assistant') conv.messages.pop();
    if (!conv.messages.length) return renderAll();
    generate(conv);
  }

  function submitEdit(conv, idx, text) {
    if (busy || !text.trim()) return;
    editing = false;
    conv.messages = conv.messages.slice(0, idx + 1);
    conv.messages[idx].content = text;
    if (idx === 0) conv.title = text.trim().replace(/\s+/g, ' ').slice(0, 60);
    generate(conv);
  }

  // Shows conversation `id` (null: a new, empty one), stopping a reply that belongs to another.
  function switchTo(id) {
    if (busy && busy.conv.id !== id) stop();
    currentId = id;
    editing = false;
    saveConvs();
    closeSide();
    hideError();
    renderAll();
  }

  function newChat() {
    switchTo(null);
    $('input').focus();
  }

  function renameConv(id) {
    const c = convs.find((x) => x.id === id);
    if (!c) return;
    const t = window.prompt('Rename the conversation', c.title || '');
    if (t == null || !t.trim()) return;
    c.title = t.trim().slice(0, 200);
    saveConvs();
    renderConvList();
  }

  function deleteConv(id) {
    const c = convs.find((x) => x.id === id);
    if (!c || !window.confirm('Delete "' + (c.title || 'New chat') + '"?')) return;
    if (busy && busy.conv.id === id) stop();
    convs = convs.filter((x) => x.id !== id);
    if (currentId === id) currentId = null;
    saveConvs();
    renderAll();
  }

  function copyText(text) {
    if (navigator.clipboard) navigator.clipboard.writeText(text).catch(() => {});
  }

  function openSide() { $('app').classList.add('side-open'); }
  function closeSide() { $('app').classList.remove('side-open'); }

  function openSettings(note) {
    $('settings-note').hidden = !note;
    $('settings-note').textContent = note || '';
    $('s-api-key').value = settings.apiKey || '';
    $('s-system').value = settings.system || '';
    $('s-temperature').value = settings.temperature;
    $('s-top-p').value = settings.top_p;
    $('s-max-tokens').value = settings.max_tokens;
    $('s-thinking').checked = !!settings.thinking;
    $('s-extra').value = settings.extra || '';
    const d = $('settings');
    if (!d.open) d.showModal();
    (note ? $('s-api-key') : $('s-system')).focus();
  }

  function saveSettingsFromForm() {
    const extra = parseExtra($('s-extra').value);
    if (!extra.ok) {
      $('settings-note').hidden = false;
      $('settings-note').textContent = 'Extra request fields: ' + extra.error;
      $('s-extra').focus();
      return;
    }
    const hadKey = settings.apiKey;
    settings = {
      apiKey: $('s-api-key').value.trim(),
      system: $('s-system').value,
      temperature: $('s-temperature').value,
      top_p: $('s-top-p').value,
      max_tokens: $('s-max-tokens').value,
      thinking: $('s-thinking').checked,
      extra: $('s-extra').value.trim(),
    };
    saveSettings();
    $('settings').close();
    if (settings.apiKey !== hadKey || !server.ok) loadServerInfo();
  }

  function autosize() {
    const t = $('input');
    t.style.height = 'auto';
    t.style.height = Math.min(t.scrollHeight, window.innerHeight * 0.4) + 'px';
  }

  // An image file as a data: URL; above the most pixels the server gives the model
  // (/props image_max_pixels) it is scaled down first (aspect kept; JPEG stays JPEG, the rest
  // becomes PNG) — the server would scale it to about that size anyway — which keeps requests and
  // the stored conversation small. Images the browser cannot decode are sent as they are (the server judges).
  async function imageUrl(f) {
    const original = () => new Promise((resolve, reject) => {
      const r = new FileReader();
      r.onload = () => resolve(String(r.result));
      r.onerror = () => reject(r.error);
      r.readAsDataURL(f);
    });
    const max = server.imageMaxPixels;
    if (!max || typeof createImageBitmap !== 'function') return original();
    let bmp;
    try { bmp = await createImageBitmap(f); } catch (e) { return original(); }
    const w = bmp.width, h = bmp.height;
    if (w * h <= max) { bmp.close(); return original(); }
    const s = Math.sqrt(max / (w * h));
    const c = document.createElement('canvas');
    c.width = Math.max(1, Math.floor(w * s));
    c.height = Math.max(1, Math.floor(h * s));
    c.getContext('2d').drawImage(bmp, 0, 0, c.width, c.height);
    bmp.close();
    return f.type === 'image/jpeg' ? c.toDataURL('image/jpeg', 0.92) : c.toDataURL('image/png');
  }

  function addImages(files) {
    const images = Array.from(files).filter((f) => f.type.startsWith('image/'));
    // In the order given, whichever finishes first.
    Promise.allSettled(images.map(imageUrl)).then((rs) => {
      rs.forEach((r, i) => {
        if (r.status === 'fulfilled') pendingImages.push(r.value);
        else showError('Could not read the image ' + images[i].name + '.');
      });
      renderControls();
    });
  }

  // ---------------------------------------------------------------------------------------------
  // Wiring

  $('composer').addEventListener('submit', (e) => { e.preventDefault(); send(); });
  $('input').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  });
  $('input').addEventListener('input', autosize);
  document.addEventListener('keydown', (e) => {
    if (e.key === 'Escape' && busy && !$('settings').open) stop();
  });
  $('stop').addEventListener('click', stop);
  $('new-chat').addEventListener('click', newChat);
  $('open-settings').addEventListener('click', () => openSettings());
  $('s-cancel').addEventListener('click', () => $('settings').close());
  $('settings-form').addEventListener('submit', (e) => { e.preventDefault(); saveSettingsFromForm(); });
  $('open-side').addEventListener('click', openSide);
  $('close-side').addEventListener('click', closeSide);
  $('backdrop').addEventListener('click', closeSide);
  $('attach').addEventListener('click', () => $('file-input').click());
  $('file-input').addEventListener('change', (e) => { addImages(e.target.files); e.target.value = ''; });
  $('input').addEventListener('paste', (e) => {
    if (!server.vision || !e.clipboardData) return;
    const files = Array.from(e.clipboardData.files || []).filter((f) => f.type.startsWith('image/'));
    if (files.length) { e.preventDefault(); addImages(files); }
  });
  // Files dragged onto the page: images join the next message (with vision); no file dropped
  // anywhere on the page makes the browser navigate away from the conversation.
  const hasFiles = (e) => !!e.dataTransfer && Array.from(e.dataTransfer.types || []).includes('Files');
  document.addEventListener('dragover', (e) => {
    if (!hasFiles(e)) return;
    e.preventDefault();
    e.dataTransfer.dropEffect = server.vision ? 'copy' : 'none';
    $('composer').classList.toggle('dropping', !!server.vision);
  });
  document.addEventListener('dragleave', (e) => {
    if (!e.relatedTarget) $('composer').classList.remove('dropping');
  });
  document.addEventListener('drop', (e) => {
    $('composer').classList.remove('dropping');
    if (!hasFiles(e)) return;
    e.preventDefault();
    if (server.vision) addImages(Array.from(e.dataTransfer.files || []));
  });
  $('messages').addEventListener('click', (e) => {
    const b = e.target.closest('button.copy-code');
    if (!b) return;
    const code = b.closest('pre').querySelector('code');
    copyText(code ? code.textContent : '');
    b.textContent = 'copied';
    setTimeout(() => { b.textContent = 'copy'; }, 1200);
  });
  window.addEventListener('storage', (e) => {
    // Another tab changed the conversations: follow it unless this tab is streaming.
    if (e.key === KEYS.convs && !busy) {
      convs = load(KEYS.convs, []);
      if (!convs.some((c) => c.id === currentId)) currentId = null;
      renderAll();
    }
  });

  // For tests and the curious: the renderer and a read-only view of the state.
  window.kiln = {
    renderMarkdown: renderMarkdown,
    libraries: { markdown: !!window.markdownit, highlight: !!window.hljs, math: !!window.katex },
    state: () => ({ busy: !!busy, currentId: currentId, conversations: convs.length, server: Object.assign({}, server) }),
  };

  renderAll();
  loadServerInfo().then(renderControls);
  $('input').focus();
})();
