// Validate an AsyncAPI document with the official parser: node asyncapi_validate.cjs PARSER_DIR FILE
// Prints the parser's diagnostics as JSON lines; exits 1 if any is an error (severity 0), else 0.
const path = require("path");
const fs = require("fs");
const { createRequire } = require("module");

const [parserDir, file] = process.argv.slice(2);
const requireFrom = createRequire(path.join(parserDir, "package.json"));
const { Parser } = requireFrom("@asyncapi/parser");

(async () => {
  const { document, diagnostics } = await new Parser().parse(fs.readFileSync(file, "utf8"));
  let errors = 0;
  for (const d of diagnostics) {
    if (d.severity === 0) errors += 1;
    console.log(JSON.stringify({ severity: d.severity, code: d.code, message: d.message, path: d.path }));
  }
  if (document === undefined || errors > 0) {
    console.log(JSON.stringify({ valid: false, errors }));
    process.exit(1);
  }
  console.log(JSON.stringify({ valid: true, channels: document.channels().length,
    operations: document.operations().length, messages: document.allMessages().length }));
})().catch((err) => { console.error(err); process.exit(2); });
