// Parses a PowerShell script with tree-sitter's PowerShell grammar (npm
// tree-sitter-powershell, run by web-tree-sitter: no PowerShell needed) and
// prints {"errors": [...], "root": ..., "statements": n} as JSON: every
// ERROR or MISSING node, with its line and column. internal/cloudinit's
// tests run it on the PowerShell part of a Windows VM's user data
// (docs/windows.md); hack/test-deps.sh installs the two packages.
//
//   node parse.mjs NODE_MODULES_DIR SCRIPT.ps1
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const [modules, file] = process.argv.slice(2);
if (!modules || !file) {
  console.error('usage: node parse.mjs NODE_MODULES_DIR SCRIPT.ps1');
  process.exit(2);
}
const require = createRequire(join(modules, 'noop.js'));
// The ES module build: the CommonJS one keeps node busy after the parse.
const { Parser, Language } = await import(pathToFileURL(join(modules, 'web-tree-sitter', 'tree-sitter.js')).href);
await Parser.init();
const language = await Language.load(require.resolve('tree-sitter-powershell/tree-sitter-powershell.wasm'));
const parser = new Parser();
parser.setLanguage(language);
const tree = parser.parse(readFileSync(file, 'utf8'));
const errors = [];
const walk = (node) => {
  if (node.isError || node.isMissing) {
    const at = `${node.startPosition.row + 1}:${node.startPosition.column + 1}`;
    errors.push(`${at}: ${node.isMissing ? 'missing ' + node.type : 'syntax error'} at ${JSON.stringify(node.text.slice(0, 60))}`);
  }
  for (const child of node.children) walk(child);
};
walk(tree.rootNode);
console.log(JSON.stringify({ errors, root: tree.rootNode.type, statements: tree.rootNode.namedChildCount }));
