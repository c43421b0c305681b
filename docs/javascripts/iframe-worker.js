// Search for the site opened from disk (site/index.html, file://), with nothing fetched.
//
// Material runs its search in a Web Worker, and Chromium refuses to start a worker from a
// file:// page.  Material's offline plugin (mkdocs.yml) inlines the search index into
// search/search_index.js and, for the worker, would add a polyfill script from unpkg.com:
// this file is that polyfill instead (the plugin adds none when one named "iframe-worker" is
// listed in extra.polyfills).  Where the page is served over HTTP it does nothing.
//
// The stand-in runs the worker's script in a hidden same-origin iframe: the page's messages
// become "message" events on the iframe's window, the script's postMessage() becomes a
// "message" event on the stand-in, and importScripts() loads each script with a <script>
// element (it returns a promise, which Material's search worker awaits).
(function () {
  "use strict";
  if (location.protocol !== "file:") return;

  class IFrameWorker extends EventTarget {
    constructor(url) {
      super();
      url = new URL(url, document.baseURI).href;
      this.onmessage = null;
      this.onerror = null;
      this._pending = [];
      this._frame = document.createElement("iframe");
      this._frame.style.display = "none";
      this._frame.setAttribute("aria-hidden", "true");
      document.body.appendChild(this._frame);

      const scope = this._frame.contentWindow;
      const load = (src) => new Promise((resolve, reject) => {
        const script = scope.document.createElement("script");
        script.src = new URL(src, url).href;
        script.onload = () => resolve();
        script.onerror = () => reject(new Error(`importScripts: cannot load ${src}`));
        scope.document.head.appendChild(script);
      });
      scope.postMessage = (data) => setTimeout(() => this._emit("message", data));
      scope.importScripts = (...sources) =>
        sources.reduce((done, src) => done.then(() => load(src)), Promise.resolve());
      load(url).then(
        () => {
          const pending = this._pending;
          this._pending = null;
          pending.forEach((data) => this.postMessage(data));
        },
        (error) => this._emit("error", error));
    }

    postMessage(data) {
      if (this._pending) {
        this._pending.push(data);
        return;
      }
      const scope = this._frame.contentWindow;
      const copy = structuredClone(data);
      setTimeout(() => scope.dispatchEvent(new scope.MessageEvent("message", {data: copy})));
    }

    terminate() {
      this._frame.remove();
    }

    _emit(type, data) {
      const event = type === "message"
        ? new MessageEvent("message", {data: structuredClone(data)})
        : new ErrorEvent("error", {error: data, message: String(data)});
      const handler = type === "message" ? this.onmessage : this.onerror;
      if (handler) handler.call(this, event);
      this.dispatchEvent(event);
    }
  }

  window.IFrameWorker = IFrameWorker;
  window.Worker = IFrameWorker;
})();
