// Validates PrometheusRule objects (JSON files) against the Prometheus
// Operator's schema, as npm's @kubernetes-models/prometheus-operator
// compiles it from the operator's CRD: types, enums and required fields
// (its validators do not refuse undeclared fields).
//
//   node scripts/prometheusrule-schema.mjs NODE_MODULES FILE...
//
// NODE_MODULES: where that package is installed (scripts/test.sh puts it
// in target/test-tools/node_modules). Exits 1 and names the fields when
// an object is invalid.
import { readFileSync } from "node:fs";

const [modules, ...files] = process.argv.slice(2);
const { PrometheusRule } = await import(
  `${modules}/@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule.js`
);
let failed = false;
for (const file of files) {
  try {
    new PrometheusRule(JSON.parse(readFileSync(file, "utf8"))).validate();
  } catch (error) {
    console.error(`${file}: ${error.message}`);
    failed = true;
  }
}
process.exit(failed ? 1 : 0);
