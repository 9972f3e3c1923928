// Validates Prometheus Operator objects (JSON files: PrometheusRule,
// ServiceMonitor, PodMonitor, by their `kind`) against the operator's
// schema, as npm's @kubernetes-models/prometheus-operator compiles it from
// the operator's CRDs: types, enums and required fields. Its validators
// do not refuse undeclared fields, so every field name is also looked up
// among the properties the package's type declarations (.d.ts) declare:
// a misspelt field (`honorLabel`) is refused, though a declared name in
// the wrong place is not.
//
//   node scripts/prometheus-operator-schema.mjs NODE_MODULES FILE...
//
// NODE_MODULES: where that package is installed (scripts/test.sh puts it
// in target/test-tools/node_modules). Exits 1 and names the fields when
// an object is invalid.
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";

const [modules, ...files] = process.argv.slice(2);
const models = `${modules}/@kubernetes-models`;

// Every property name the declarations of the operator's v1 types and of
// Kubernetes' ObjectMeta declare.
function declaredNames() {
  const names = new Set();
  for (const dir of [
    `${models}/prometheus-operator/monitoring.coreos.com/v1`,
    `${models}/apimachinery/apis/meta/v1`,
  ]) {
    for (const file of readdirSync(dir).filter((f) => f.endsWith(".d.ts"))) {
      const text = readFileSync(join(dir, file), "utf8");
      for (const match of text.matchAll(/"([^"]+)"\??:/g)) names.add(match[1]);
    }
  }
  return names;
}

// Maps whose keys are the user's (label and annotation names).
const FREE_FORM = new Set(["labels", "annotations", "matchLabels"]);

function undeclared(value, path, names, out) {
  if (Array.isArray(value)) {
    value.forEach((item, i) => undeclared(item, `${path}[${i}]`, names, out));
  } else if (value !== null && typeof value === "object") {
    for (const [key, child] of Object.entries(value)) {
      if (!names.has(key)) out.push(`${path}.${key}`);
      else if (!FREE_FORM.has(key)) undeclared(child, `${path}.${key}`, names, out);
    }
  }
}

const names = declaredNames();
let failed = false;
for (const file of files) {
  const object = JSON.parse(readFileSync(file, "utf8"));
  try {
    const { [object.kind]: Model } = await import(
      `${models}/prometheus-operator/monitoring.coreos.com/v1/${object.kind}.js`
    );
    new Model(object).validate();
    const unknown = [];
    undeclared(object, "", names, unknown);
    if (unknown.length > 0) throw new Error(`undeclared fields: ${unknown.join(", ")}`);
  } catch (error) {
    console.error(`${file}: ${error.message}`);
    failed = true;
  }
}
process.exit(failed ? 1 : 0);
