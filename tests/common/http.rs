//! A real HTTP/1.1 server on 127.0.0.1 for webhook tests: it records every request, with when it
//! came, and answers as a script says: responses in order (the last one repeats), or any rule of
//! the request's number and time.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Instant;

#[derive(Clone, Debug)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
    pub at: Instant,
    /// The status it was answered with.
    pub status: u16,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

pub struct Server {
    pub url: String,
    pub requests: Arc<Mutex<Vec<Request>>>,
}

/// A response: status, extra header lines, body.
pub type Response = (u16, &'static str, &'static str);

/// `responses`, in order; the last one repeats.
pub fn serve(responses: Vec<Response>) -> Server {
    serve_with(move |index, _| responses[index.min(responses.len() - 1)])
}

/// Answers the request numbered `index` from 0, which came at `at`, as `respond` says.
pub fn serve_with(respond: impl Fn(usize, Instant) -> Response + Send + Sync + 'static) -> Server {
    let respond = Arc::new(respond);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let requests = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&requests);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let seen = Arc::clone(&seen);
            let respond = Arc::clone(&respond);
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut writer = stream;
                // Keep-alive: answer requests on this connection until the client closes it.
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let mut words = line.split_whitespace();
                    let method = words.next().unwrap_or("").to_owned();
                    let path = words.next().unwrap_or("").to_owned();
                    let mut headers = vec![];
                    let mut length = 0usize;
                    loop {
                        let mut h = String::new();
                        reader.read_line(&mut h).unwrap();
                        let h = h.trim_end();
                        if h.is_empty() {
                            break;
                        }
                        let (k, v) = h.split_once(':').unwrap();
                        if k.eq_ignore_ascii_case("content-length") {
                            length = v.trim().parse().unwrap();
                        }
                        headers.push((k.to_owned(), v.trim().to_owned()));
                    }
                    let mut body = vec![0; length];
                    reader.read_exact(&mut body).unwrap();
                    let (status, extra, text) = {
                        let mut all = seen.lock().unwrap();
                        let at = Instant::now();
                        let response = respond(all.len(), at);
                        all.push(Request {
                            method,
                            path,
                            headers,
                            body: String::from_utf8(body).unwrap(),
                            at,
                            status: response.0,
                        });
                        response
                    };
                    let reply = format!(
                        "HTTP/1.1 {status} X\r\nContent-Length: {}\r\n{extra}\r\n{text}",
                        text.len()
                    );
                    if writer.write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    Server { url, requests }
}

/// A GET with a one-second bound on everything, as an orchestrator's probe makes it.
pub fn probe(url: &str) -> Result<(u16, String), String> {
    crate::common::block_on(async {
        let client = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(1))
            .build()
            .unwrap();
        let response = client.get(url).send().await.map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        Ok((status, response.text().await.map_err(|e| e.to_string())?))
    })
}
