// poolctl's hooks in jsii's Node kernel, which starts with them (`--require` in NODE_OPTIONS,
// set by poolctl_stacks/__init__.py, so `poolctl synth` and `cdktn synth` both get them).
// Each leaves the kernel's behaviour as it was and only removes a cost; with a Node that
// lacks the API a hook uses, that hook is simply absent. Costs measured in docs/install.md.
"use strict";

const mod = require("node:module");
const threads = require("node:worker_threads");

// 1. A prebuilt provider's submodules load when first used, not all at start-up.
//
// The kernel `require`s a provider package's lib/index.js on the first import of the
// provider and reaches a type through the index's exports (`closure.instance.Instance`).
// The index of @cdktn/provider-aws requires all of its ~2,200 submodules (provider-google
// ~1,850): 2.8 s of a 3.2 s load, for the ~30 a pool's stack uses. This load hook
// (module.registerHooks, Node >= 22.15) serves that index with each
// `exports.x = __importStar(require("./x/index"));` turned into an enumerable getter that
// requires the submodule on first access and then keeps it: the same exports, the same
// objects, loaded on demand. Any other file, or an index of another shape, loads untouched.

// The package root in the kernel's install dir (node_modules/@cdktn/provider-aws/lib/) or in
// jsii's package cache (@cdktn/provider-aws/<version>/<hash>/lib/).
const INDEX = /\/@cdktn\/provider-[a-z0-9-]+\/(?:[^/]+\/){0,2}lib\/index\.js$/;
const LINE = /^exports\.([A-Za-z_$][\w$]*) = __importStar\(require\(("\.\/[\w./-]+")\)\);$/gm;
const LAZY =
  "function __poolctlLazy(o, k, load) {\n" +
  "  Object.defineProperty(o, k, { enumerable: true, configurable: true, get() {\n" +
  "    const v = load();\n" +
  "    Object.defineProperty(o, k, { value: v, enumerable: true, writable: true, configurable: true });\n" +
  "    return v;\n" +
  "  } });\n" +
  "}\n";

if (typeof mod.registerHooks === "function") {
  mod.registerHooks({
    load(url, context, nextLoad) {
      const result = nextLoad(url, context);
      if (!INDEX.test(url) || result.source == null) return result;
      let n = 0;
      const source = result.source.toString().replace(LINE, (_, name, path) => {
        n += 1;
        return `__poolctlLazy(exports, "${name}", () => __importStar(require(${path})));`;
      });
      // Appended: a function declaration is hoisted, and "use strict" stays the first line.
      return n === 0 ? result : { ...result, source: `${source}\n${LAZY}` };
    },
  });
}

// 2. jsii's runtime index gets written, once.
//
// With its package cache (on by default), the kernel loads an assembly through a "runtime
// index" it keeps beside the cached package; when there is none yet, it parses the whole
// .jsii (155 MB for provider-aws: ~1 s and ~1 GB) and builds the index in a worker thread,
// "best-effort" (aws/jsii#5164). That worker needs ~2.5 s; a synth is shorter, and the
// kernel's exit ends it, so the index is never written and every synth pays the full parse
// (and a second one in the worker). Here the kernel's exit waits for a running index worker,
// at most 4 s (jsii's Python side waits 5 s for the kernel to end): the first synth takes a
// few seconds longer, the following ones read the index.
const INDEX_WORKER = /runtime-index-worker\.js$/;
const WAIT_MS = 4000;
const building = new Set();

if (typeof threads.Worker === "function") {
  const Worker = threads.Worker;
  threads.Worker = class extends Worker {
    constructor(filename, ...rest) {
      super(filename, ...rest);
      if (INDEX_WORKER.test(String(filename))) {
        building.add(this);
        this.once("exit", () => building.delete(this));
      }
    }
  };
  const exit = process.exit;
  process.exit = function (code) {
    if (building.size === 0) return exit.call(process, code);
    const done = () => exit.call(process, code);
    setTimeout(done, WAIT_MS);
    for (const w of building) w.once("exit", () => building.size === 0 && done());
    return undefined;
  };
}
