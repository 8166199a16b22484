//! `kiln cache`: the on-disk kernel cache.
use crate::args::{ArgParser, Token, unknown};
use crate::error::CliError;
pub const USAGE: &str = "kiln cache stats|clear";
#[derive(Debug, Default)]
pub struct CacheArgs {
    pub clear: bool,
}
impl CacheArgs {
    pub fn parse(p: &mut ArgParser) -> Result<CacheArgs, CliError> {
        let mut a = CacheArgs::default();
        while let Some(tok) = p.next_token()? {
            match tok {
                Token::Positional(s) if s == "clear" => a.clear = true,
                Token::Positional(s) if s == "stats" => a.clear = false,
                tok => return Err(unknown("cache", tok)),
            }
        }
        Ok(a)
    }
}
pub fn run(_a: &CacheArgs) -> Result<String, CliError> {
    stats_text()
}
pub fn stats_text() -> Result<String, CliError> {
    Ok(String::new())
}
