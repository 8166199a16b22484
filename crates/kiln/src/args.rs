//! A small command-line tokenizer: long flags (`--name value` or `--name=value`), short
//! `-h`/`-v`, positionals, and `--` to end flags. Each subcommand drives it in a loop and
//! decides what a flag means; anything unexpected is a [`CliError::Usage`].

use std::ffi::OsString;

use crate::error::CliError;

/// One token of the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Token {
    /// `--name` or `-n` (the name includes the dashes), with an inline `=value` if given.
    Flag(String, Option<String>),
    Positional(String),
}

pub struct ArgParser {
    args: Vec<String>,
    pos: usize,
    only_positionals: bool,
    /// The inline value of the flag just returned, until `value()` takes it.
    inline: Option<String>,
    last_flag: String,
}

impl ArgParser {
    /// Fails on arguments that are not valid UTF-8 (kernel paths and slots are text).
    pub fn new(args: impl IntoIterator<Item = OsString>) -> Result<ArgParser, CliError> {
        let args = args
            .into_iter()
            .map(|a| a.into_string().map_err(|a| CliError::Usage(format!("argument {a:?} is not valid UTF-8"))))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ArgParser { args, pos: 0, only_positionals: false, inline: None, last_flag: String::new() })
    }

    /// The next token, or `None` at the end. A flag's inline value that nobody took with
    /// [`ArgParser::value`] is an error (`--verbose=yes` on a switch).
    pub fn next_token(&mut self) -> Result<Option<Token>, CliError> {
        if let Some(v) = self.inline.take() {
            return Err(CliError::Usage(format!("{} does not take a value (got `{v}`)", self.last_flag)));
        }
        let Some(arg) = self.args.get(self.pos).cloned() else {
            return Ok(None);
        };
        self.pos += 1;
        if self.only_positionals || arg == "-" || !arg.starts_with('-') {
            return Ok(Some(Token::Positional(arg)));
        }
        if arg == "--" {
            self.only_positionals = true;
            return self.next_token();
        }
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (arg, None),
        };
        self.last_flag = name.clone();
        self.inline = inline.clone();
        Ok(Some(Token::Flag(name, inline)))
    }

    /// The arguments not consumed yet.
    pub fn remaining(&self) -> &[String] {
        &self.args[self.pos..]
    }

    /// The value of the flag just returned: its inline `=value` or the next argument.
    pub fn value(&mut self) -> Result<String, CliError> {
        if let Some(v) = self.inline.take() {
            return Ok(v);
        }
        match self.args.get(self.pos) {
            Some(v) if !v.starts_with("--") || v.len() == 2 => {
                self.pos += 1;
                Ok(v.clone())
            }
            _ => Err(CliError::Usage(format!("{} needs a value", self.last_flag))),
        }
    }
}

/// Splits `NAME=VALUE` (for `--var`, `--in`, `--out`).
pub fn split_pair(flag: &str, text: &str, example: &str) -> Result<(String, String), CliError> {
    match text.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() && !v.is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(CliError::Usage(format!("{flag} expects {example}, got `{text}`"))),
    }
}

/// An error for a flag the subcommand does not know.
pub fn unknown(command: &str, token: Token) -> CliError {
    match token {
        Token::Flag(name, _) => CliError::Usage(format!("`kiln {command}` has no option {name}")),
        Token::Positional(p) => CliError::Usage(format!("unexpected argument `{p}` for `kiln {command}`")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parser(args: &[&str]) -> ArgParser {
        ArgParser::new(args.iter().map(OsString::from)).unwrap()
    }

    #[test]
    fn tokenizes_flags_values_and_positionals() {
        let mut p = parser(&["k.kiln", "--var", "n=3", "--device=CPU", "--", "--odd"]);
        assert_eq!(p.next_token().unwrap(), Some(Token::Positional("k.kiln".into())));
        assert_eq!(p.next_token().unwrap(), Some(Token::Flag("--var".into(), None)));
        assert_eq!(p.value().unwrap(), "n=3");
        assert_eq!(p.next_token().unwrap(), Some(Token::Flag("--device".into(), Some("CPU".into()))));
        assert_eq!(p.value().unwrap(), "CPU");
        assert_eq!(p.next_token().unwrap(), Some(Token::Positional("--odd".into())));
        assert_eq!(p.next_token().unwrap(), None);
    }

    #[test]
    fn missing_and_unwanted_values_are_usage_errors() {
        let mut p = parser(&["--var"]);
        p.next_token().unwrap();
        assert!(matches!(p.value(), Err(CliError::Usage(m)) if m.contains("--var needs a value")));
        let mut p = parser(&["--var", "--out", "x"]);
        p.next_token().unwrap();
        assert!(p.value().is_err());
        let mut p = parser(&["--verbose=yes"]);
        p.next_token().unwrap();
        assert!(matches!(p.next_token(), Err(CliError::Usage(m)) if m.contains("does not take a value")));
        assert!(split_pair("--var", "n", "NAME=VALUE").is_err());
        assert!(split_pair("--var", "=3", "NAME=VALUE").is_err());
        assert_eq!(split_pair("--in", "0=a=b.npy", "").unwrap(), ("0".into(), "a=b.npy".into()));
    }
}
